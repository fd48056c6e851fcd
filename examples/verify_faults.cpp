// examples/verify_faults.cpp: what a receiver refuses, and what post-apply checks catch.
//
// The receiver API below is what a receiver agent calls for every delivery (begin_attempt,
// apply_payload, end_transition); here the example drives it by hand so that it can damage a
// payload on the way.
//
// 1. Faults on delivery: a payload with one flipped byte is refused (corrupt_payload) before
//    any write; the intact payload is applied; a second delivery of it is dropped as a
//    duplicate; a payload of an attempt the receiver has moved past is refused as stale.
// 2. Tied storage: an engine that stores lm_head in the embedding's storage.
//    a. The model ties the two and the loader declares it (`tied_tensors()`): a real tie, both
//       tensors become overwrite-only and a refit is exact.
//    b. The loader writes lm_head into the embedding's storage without declaring a tie (the
//       tied-weights trap: a wrong buffer name in an untied model): prewarm refuses it, naming
//       both tensors and the destination bytes.
//    c. A declared tie the checkpoint does not keep (the two tensors differ): post-apply
//       checks (`apply_options::verify`) refuse a payload whose two tensors write different
//       bits into one element. They cannot see a step that changes only one of the two, so
//       declare a tie only where the model has one.
//
// Exits non-zero if any of these does not hold.
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "dcr/dcr.hpp"

namespace {

constexpr std::int64_t vocab = 8, hidden = 4;
using words = std::vector<std::uint16_t>;

// The engine: embedding rows, an lm_head buffer (unused when lm_head is tied to the embedding)
// and the final norm.
struct engine {
  words embedding = words(vocab * hidden), lm_head = words(vocab * hidden), norm = words(hidden);
  friend bool operator==(const engine&, const engine&) = default;
};

// The engine's loader. `tie_lm_head`: lm_head goes into the embedding's storage; `declare_tie`:
// the loader says so (the engine's config ties the word embeddings).
struct engine_loader {
  using loader_concept = dcr::loader_tag;
  engine* e;
  bool tie_lm_head = false;
  bool declare_tie = false;

  std::vector<dcr::tensor_tie> tied_tensors() const {
    if (!declare_tie) return {};
    return {{"model.embed_tokens.weight", "lm_head.weight"}};
  }

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    words& buffer = t.name == "model.norm.weight"                      ? e->norm
                    : t.name == "lm_head.weight" && !tie_lm_head ? e->lm_head
                                                                       : e->embedding;
    sink.copy(dcr::tensor_view<W>::contiguous(reinterpret_cast<W*>(buffer.data()), t.shape), src);
  }
};

const dcr::tensor_registry registry({{"model.embed_tokens.weight", dcr::dtype::bf16, {vocab, hidden}},
                                     {"lm_head.weight", dcr::dtype::bf16, {vocab, hidden}},
                                     {"model.norm.weight", dcr::dtype::bf16, {hidden}}});

// A one-rank trainer: one shard per canonical tensor, each the whole tensor (replicated).
struct trainer {
  std::vector<words> shards;  // in registry id order
  dcr::owner owner;

  explicit trainer(bool tied_values) : owner(registry, 0, tasks()) {
    for (const auto& t : registry.tensors()) {
      words w(static_cast<std::size_t>(t.numel()));
      for (std::size_t j = 0; j < w.size(); ++j)
        w[j] = dcr::float_to_bf16(0.02f * static_cast<float>(j) + (t.name[0] == 'l' && !tied_values ? 1.0f : 0.0f));
      shards.push_back(std::move(w));
    }
    owner.initialize(spans());
  }
  static std::vector<dcr::affine_task> tasks() {
    std::vector<dcr::affine_task> out;
    for (dcr::tensor_id id = 0; id < registry.size(); ++id) {
      dcr::affine_task t;
      t.shard_name = registry.at(id).name;
      t.mapping = dcr::replicated(static_cast<std::uint64_t>(registry.at(id).numel()));
      t.targets = {id};
      out.push_back(t);
    }
    return out;
  }
  std::vector<std::span<const std::byte>> spans() const {
    std::vector<std::span<const std::byte>> out;
    for (const auto& s : shards) out.push_back(std::as_bytes(std::span(s)));
    return out;
  }
  words& shard(const char* name) { return shards[registry.id(name)]; }

  // The payloads of attempt `key` for the trainer's current words (what an owner agent puts).
  std::vector<std::vector<std::byte>> payloads(const dcr::attempt_key& key) {
    const auto& items = owner.build_items(spans(), dcr::encoding_policy::mixed);
    dcr::payload_header header;
    header.id = {key, owner.id(), 0};
    header.registry_fingerprint = registry.fingerprint();
    dcr::payload_encoder encoder;
    std::vector<std::vector<std::byte>> out;
    dcr::pack_payloads(registry, header, items, std::size_t{64} << 20, encoder, out);
    return out;
  }
};

// A receiver over fresh storage, prewarmed and loaded densely with the trainer's words.
struct serving_rank {
  engine storage;
  engine_loader loader;
  dcr::receiver<engine_loader> rx;
  serving_rank(const trainer& t, bool tie, bool declare) : loader{&storage, tie, declare}, rx(registry, loader) {
    rx.prewarm();
    for (dcr::tensor_id id = 0; id < registry.size(); ++id)
      rx.dense_load<std::uint16_t>(id, dcr::tensor_view<const std::uint16_t>::contiguous(
                                           t.shards[id].data(), registry.at(id).shape));
  }
};

// Runs `f`; returns the dcr::errc it threw (errc::ok if none) and keeps the message.
template <class F>
dcr::errc code_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const dcr::error& e) {
    if (message != nullptr) *message = e.what();
    return e.dcr_code();
  }
  return dcr::errc::ok;
}

bool check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  return ok;
}

}  // namespace

int main() {
  bool ok = true;

  // ---- 1. faults on delivery
  {
    trainer train(/*tied_values=*/false);
    serving_rank rank(train, /*tie=*/false, /*declare=*/false);
    train.shard("model.norm.weight")[1] ^= 0x0001;
    train.shard("model.embed_tokens.weight")[5] ^= 0x0010;
    train.shard("lm_head.weight")[9] ^= 0x8000;  // a sign bit: -x, exact

    const dcr::attempt_key attempt0{0, 1, 0};
    const auto payloads = train.payloads(attempt0);
    ok &= check(payloads.size() == 1, "one payload for three changed elements");
    rank.rx.begin_attempt(attempt0);

    auto damaged = payloads[0];
    damaged[damaged.size() / 2] ^= std::byte{0x40};
    const engine before = rank.storage;
    ok &= check(code_of([&] { rank.rx.apply_payload(damaged); }) == dcr::errc::corrupt_payload,
                "a payload with one flipped byte is refused as corrupt_payload");
    ok &= check(rank.storage == before, "the refused payload wrote nothing");

    ok &= check(rank.rx.apply_payload(payloads[0]) == dcr::apply_outcome::applied,
                "the intact payload is applied");
    ok &= check(rank.rx.apply_payload(payloads[0]) == dcr::apply_outcome::duplicate,
                "the same payload again is dropped as a duplicate (xor twice would undo it)");

    // The coordinator fenced attempt 0 and opened attempt 1: attempt 0's payloads are stale.
    rank.rx.begin_attempt({0, 1, 1});
    const engine applied = rank.storage;
    ok &= check(code_of([&] { rank.rx.apply_payload(payloads[0]); }) == dcr::errc::stale_payload,
                "a payload of a fenced attempt is refused as stale_payload");
    ok &= check(rank.storage == applied, "the stale payload wrote nothing");

    train.owner.commit(train.spans());
    rank.rx.end_transition(1);
    serving_rank dense(train, false, false);
    ok &= check(rank.storage == dense.storage, "the receiver holds a dense refit's bits");
  }

  // ---- 2a. a real tie: the checkpoint keeps lm_head equal to the embedding
  {
    trainer train(/*tied_values=*/true);
    serving_rank rank(train, /*tie=*/true, /*declare=*/true);
    const auto report = rank.rx.placement_report();
    const auto& lm = report[registry.id("lm_head.weight")];
    std::printf("      lm_head.weight: overwrite_only=%d (%s)\n", lm.overwrite_only, lm.reason.c_str());
    ok &= check(lm.overwrite_only && report[registry.id("model.embed_tokens.weight")].overwrite_only,
                "tied tensors are overwrite-only on this rank");
    train.owner.set_overwrite_only(rank.rx.overwrite_only_tensors());  // the coordinator does this

    for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"})  // one update, both
      train.shard(name)[6] = dcr::float_to_bf16(-0.75f);
    const dcr::attempt_key key{0, 1, 0};
    const auto payloads = train.payloads(key);
    rank.rx.begin_attempt(key);
    for (const auto& p : payloads) rank.rx.apply_payload(p, {dcr::apply_path::compiled, /*verify=*/true});
    ok &= check(rank.rx.stats().verified == rank.rx.stats().writes && rank.rx.stats().writes > 0,
                "post-apply checks hold for every write of a real tie");
    serving_rank dense(train, true, true);
    ok &= check(rank.storage == dense.storage, "a real tie refits to a dense refit's bits");
  }

  // ---- 2b. the tied-weights trap: lm_head written into the embedding's storage, undeclared
  {
    trainer train(/*tied_values=*/false);
    std::string refused;
    const auto at_prewarm = code_of([&] { serving_rank probe(train, /*tie=*/true, /*declare=*/false); }, &refused);
    ok &= check(at_prewarm == dcr::errc::unsupported_loader_path, "prewarm refuses the undeclared overlap");
    std::printf("      %s\n", refused.c_str());
    ok &= check(refused.find("lm_head.weight") != std::string::npos &&
                    refused.find("model.embed_tokens.weight") != std::string::npos,
                "the refusal names both tensors");
  }

  // ---- 2c. a declared tie the checkpoint does not keep: post-apply checks
  {
    trainer train(/*tied_values=*/false);
    serving_rank rank(train, /*tie=*/true, /*declare=*/true);
    train.owner.set_overwrite_only(rank.rx.overwrite_only_tensors());
    // An optimizer step moves both tensors at element 6, to different bits.
    train.shard("model.embed_tokens.weight")[6] = dcr::float_to_bf16(0.5f);
    train.shard("lm_head.weight")[6] = dcr::float_to_bf16(1.5f);
    const dcr::attempt_key key{0, 1, 0};
    const auto payloads = train.payloads(key);
    rank.rx.begin_attempt(key);
    std::string message;
    const auto code = code_of(
        [&] {
          for (const auto& p : payloads)
            rank.rx.apply_payload(p, {dcr::apply_path::compiled, /*verify=*/true});
        },
        &message);
    ok &= check(code == dcr::errc::verification_failed,
                "post-apply checks refuse two tensors writing different bits into one element");
    std::printf("      %s\n", message.c_str());
    ok &= check(message.find("element 6") != std::string::npos, "the message names the tensor's element");
    // A receiver agent acknowledges this attempt as failed, so the coordinator never commits it;
    // the overwrite retry fails the same way until the declaration is fixed.
  }

  std::printf("%s\n", ok ? "all checks hold" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
