// examples/residual_task.cpp: the trainer side, with a residual task.
//
// A trainer of TP=2 x DP=2 ranks holds a small model. Most of it reaches the checkpoint
// unchanged, through affine tasks (a column split of o_proj per TP rank, a replicated norm);
// one tensor does not: the trainer keeps ONE embedding table, padded to a multiple of 4 rows,
// and the checkpoint has two tensors built from it, `model.embed_tokens.weight` and
// `lm_head.weight` (tied), without the padding rows. A residual task converts it.
//
// Ownership: each unique shard is compared by exactly one of the ranks holding it
// (dcr::assign_owners balances bytes over the holders; DP replicas are bit-identical), and the
// residual task has one owner chosen from its name (dcr::assign_residual_owners).
//
// Two optimizer steps follow. The first changes words everywhere; the second changes only
// padding rows, which the residual task rebuilds and finds unchanged in canonical terms, so it
// sends nothing for them. After each step the serving rank must hold exactly the bits of a
// dense refit of the new weights; the program exits non-zero otherwise.
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/dcr.hpp"

namespace {

constexpr std::int64_t vocab = 10, padded_vocab = 12, hidden = 4;
constexpr int tp = 2, dp = 2;

using words = std::vector<std::uint16_t>;

// ---- the trainer

// What one training rank holds: its shards by name.
struct trainer_rank {
  std::map<std::string, words> shards;
};

// o_proj [hidden, hidden] is split by columns over the TP ranks; norm [hidden] is replicated on
// every rank; the padded embedding [padded_vocab, hidden] is replicated on every rank too.
std::string o_proj_shard(int t) { return "o_proj.tp" + std::to_string(t); }

// ---- the residual task: padded embedding -> embed_tokens and lm_head

dcr::residual_task tied_embedding_task(const dcr::tensor_registry& registry) {
  dcr::residual_task task;
  task.name = "tied_embedding";
  task.inputs = {{"embedding (padded)", dcr::dtype::bf16,
                  static_cast<std::uint64_t>(padded_vocab * hidden)}};
  task.outputs = {{registry.id("model.embed_tokens.weight"), {0}},
                  {registry.id("lm_head.weight"), {0}}};
  // Both outputs are the first `vocab` rows of the padded table. Every byte of `destination`
  // is written (the owner reuses one scratch buffer for every output).
  task.convert = [](std::size_t /*output*/, std::span<const std::span<const std::byte>> inputs,
                    std::span<std::byte> destination) {
    const auto table = dcr::words_of<std::uint16_t>(inputs[0]);
    auto out = dcr::words_of<std::uint16_t>(destination);
    std::copy(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
  };
  return task;
}

// ---- the serving rank: one buffer per canonical tensor (the loader's simplest case)

struct flat_engine {
  std::map<std::string, words> storage;
};

struct flat_loader {
  using loader_concept = dcr::loader_tag;
  flat_engine* e;

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    auto& buffer = e->storage[t.name];
    buffer.resize(static_cast<std::size_t>(t.numel()));
    sink.copy(dcr::tensor_view<W>::contiguous(reinterpret_cast<W*>(buffer.data()), t.shape), src);
  }
};

std::uint16_t bf16(float f) { return dcr::float_to_bf16(f); }

}  // namespace

int main() {
  const dcr::tensor_registry registry({
      {"model.embed_tokens.weight", dcr::dtype::bf16, {vocab, hidden}},
      {"lm_head.weight", dcr::dtype::bf16, {vocab, hidden}},
      {"model.norm.weight", dcr::dtype::bf16, {hidden}},
      {"o_proj.weight", dcr::dtype::bf16, {hidden, hidden}},
  });
  const auto& o_shape = registry.at(registry.id("o_proj.weight")).shape;

  // The trainer's ranks: rank = d * tp + t. DP replicas hold bit-identical shards.
  std::vector<trainer_rank> ranks(tp * dp);
  for (int r = 0; r < tp * dp; ++r) {
    const int t = r % tp;
    auto& s = ranks[r].shards;
    s["norm"] = words(hidden);
    for (std::int64_t i = 0; i < hidden; ++i) s["norm"][i] = bf16(1.0f + 0.125f * i);
    s[o_proj_shard(t)] = words(dcr::local_size(dcr::column_split(o_shape, tp, t)));
    for (std::size_t j = 0; j < s[o_proj_shard(t)].size(); ++j)
      s[o_proj_shard(t)][j] = bf16(0.01f * static_cast<float>(j + 100 * t));
    s["embedding"] = words(padded_vocab * hidden);
    for (std::size_t j = 0; j < s["embedding"].size(); ++j)
      s["embedding"][j] = bf16(-0.5f + 0.03f * static_cast<float>(j));
  }

  // Affine tasks, one per unique shard, and who holds a copy of each.
  std::vector<dcr::affine_task> affine;
  std::vector<dcr::shard_holding> holdings;
  {
    dcr::affine_task norm;
    norm.shard_name = "norm";
    norm.mapping = dcr::replicated(static_cast<std::uint64_t>(hidden));
    norm.targets = {registry.id("model.norm.weight")};
    affine.push_back(norm);
    holdings.push_back({"norm", norm.bytes(), {0, 1, 2, 3}});
    for (int t = 0; t < tp; ++t) {
      dcr::affine_task o;
      o.shard_name = o_proj_shard(t);
      o.mapping = dcr::column_split(o_shape, tp, t);
      o.targets = {registry.id("o_proj.weight")};
      affine.push_back(o);
      std::vector<std::uint32_t> holders;
      for (int d = 0; d < dp; ++d) holders.push_back(static_cast<std::uint32_t>(d * tp + t));
      holdings.push_back({o.shard_name, o.bytes(), holders});
    }
  }
  const auto affine_owner = dcr::assign_owners(holdings);
  const std::vector<dcr::residual_holding> residual_holdings{{"tied_embedding", {0, 1, 2, 3}}};
  const std::uint32_t residual_owner = dcr::assign_residual_owners(residual_holdings)[0];

  // Check the whole model's task set once (each owner sees only its own tasks).
  const std::vector<dcr::residual_task> all_residual{tied_embedding_task(registry)};
  dcr::validate_task_set(registry, affine, all_residual);
  const auto coverage = dcr::measure_coverage(registry, affine, all_residual);
  std::printf("affine share of the checkpoint: %.1f%%\n", 100.0 * coverage.affine_share());

  // One dcr::owner per rank that owns something, bound to that rank's own copies.
  std::vector<std::unique_ptr<dcr::owner>> owners;
  std::vector<dcr::owner_binding> bindings;
  for (std::uint32_t r = 0; r < tp * dp; ++r) {
    std::vector<dcr::affine_task> mine;
    for (std::size_t i = 0; i < affine.size(); ++i)
      if (affine_owner[i] == r) mine.push_back(affine[i]);
    std::vector<dcr::residual_task> mine_residual;
    if (residual_owner == r) mine_residual.push_back(tied_embedding_task(registry));
    if (mine.empty() && mine_residual.empty()) continue;
    std::printf("rank %u owns:", r);
    for (const auto& t : mine) std::printf(" %s", t.shard_name.c_str());
    for (const auto& t : mine_residual) std::printf(" %s (residual)", t.name.c_str());
    std::printf("\n");

    dcr::owner_binding b;
    for (const auto& t : mine) b.candidates.push_back(std::as_bytes(std::span(ranks[r].shards[t.shard_name])));
    if (!mine_residual.empty())
      b.residual_inputs.push_back(std::as_bytes(std::span(ranks[r].shards["embedding"])));
    owners.push_back(std::make_unique<dcr::owner>(registry, r, std::move(mine), std::move(mine_residual)));
    owners.back()->initialize(b.candidates, b.residual_inputs);  // version 0 = today's words
    b.owner_ptr = owners.back().get();
    bindings.push_back(std::move(b));
  }

  // The checkpoint (canonical tensors) the trainer's current words stand for, built from
  // rank 0's and rank 1's copies: the mapping classes say where each shard element goes.
  auto canonical = [&](const std::string& name) {
    const auto& t = registry.at(registry.id(name));
    words full(static_cast<std::size_t>(t.numel()));
    if (name == "model.norm.weight") full = ranks[0].shards["norm"];
    if (name == "o_proj.weight")
      for (int r = 0; r < tp; ++r) {
        const dcr::column_split m(o_shape, tp, r);
        const auto& shard = ranks[r].shards[o_proj_shard(r)];
        for (std::uint64_t j = 0; j < shard.size(); ++j) full[m(j).index] = shard[j];
      }
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
      std::copy_n(ranks[0].shards["embedding"].begin(), full.size(), full.begin());
    return full;
  };
  auto dense_load = [&](dcr::receiver<flat_loader>& rx) {
    for (const auto& t : registry.tensors()) {
      const auto w = canonical(t.name);
      rx.dense_load<std::uint16_t>(registry.id(t.name),
                                   dcr::tensor_view<const std::uint16_t>::contiguous(w.data(), t.shape));
    }
  };

  flat_engine engine;
  flat_loader loader{&engine};
  dcr::receiver<flat_loader> rx(registry, loader);
  rx.prewarm();
  dense_load(rx);

  dcr::receiver_endpoint* receivers[] = {&rx};
  dcr::in_process_refit refit(registry, std::span(bindings), std::span(receivers), 0);

  // An optimizer step: the same update on every DP replica.
  auto step = [&](auto&& update) {
    for (auto& r : ranks) update(r.shards);
    return refit.run();
  };
  auto exact = [&] {
    flat_engine reference;
    flat_loader reference_loader{&reference};
    dcr::receiver<flat_loader> dense(registry, reference_loader);
    dense.prewarm();
    dense_load(dense);
    return engine.storage == reference.storage;
  };

  bool ok = true;
  // Step 1: changes in every kind of shard, real embedding rows included.
  const auto one = step([](std::map<std::string, words>& s) {
    s["norm"][2] ^= 0x0001;
    for (auto& [name, w] : s)
      if (name.starts_with("o_proj")) w[3] ^= 0x0010;
    s["embedding"][5] ^= 0x8000;              // row 1: in both canonical tensors
    s["embedding"][vocab * hidden + 1] ^= 1;  // a padding row
  });
  const auto& a1 = one.attempts.back();
  const bool exact1 = exact();
  std::printf("step 1: committed %s, %s; %llu record(s): %llu from affine shards, %llu from "
              "%llu residual conversion(s); %llu payload byte(s)\n",
              one.committed ? "yes" : "no", exact1 ? "exact" : "NOT EXACT",
              static_cast<unsigned long long>(a1.records),
              static_cast<unsigned long long>(a1.owners.changed_elements),
              static_cast<unsigned long long>(a1.owners.residual_changed_elements),
              static_cast<unsigned long long>(a1.owners.residual_conversions),
              static_cast<unsigned long long>(a1.payload_bytes));
  // Affine: norm 1 + o_proj 2 (one per column split). Residual: embedding row 1 lands in both
  // tied tensors (2); the padding change lands nowhere.
  ok = ok && one.committed && exact1 && a1.owners.changed_elements == 3 &&
       a1.owners.residual_conversions == 2 && a1.owners.residual_changed_elements == 2 && a1.records == 5;

  // Step 2: only padding rows change. The task is rebuilt (its input changed) but its canonical
  // outputs did not, so no record is sent for them.
  const auto two = step([](std::map<std::string, words>& s) {
    s["embedding"][vocab * hidden + 6] ^= 0x0100;
  });
  const auto& a2 = two.attempts.back();
  const bool exact2 = exact();
  std::printf("step 2: committed %s, %s; %llu residual conversion(s), %llu record(s)\n",
              two.committed ? "yes" : "no", exact2 ? "exact" : "NOT EXACT",
              static_cast<unsigned long long>(a2.owners.residual_conversions),
              static_cast<unsigned long long>(a2.records));
  ok = ok && two.committed && exact2 && a2.owners.residual_conversions == 2 &&
       a2.owners.residual_changed_elements == 0 && a2.records == 0;

  std::printf("%s\n", ok ? "bit-identical to a dense refit after every step" : "FAILED");
  return ok ? 0 : 1;
}
