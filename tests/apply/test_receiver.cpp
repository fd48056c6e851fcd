// receiver: prewarm publishes the overwrite-only tensors (sorted) and a placement report, a
// payload with an xor record for one of them is refused with storage unchanged, and the apply
// path and post-apply checks are switchable per payload.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/refit/receiver.hpp"
#include "test_engine.hpp"
#include "test_models.hpp"

namespace {

using dcr::apply_options;
using dcr::apply_path;
using dcr::encoding;
using dcr::errc;
using dcr::item;
using dcr::tensor_id;
using dcr_test::engine_storage;
using dcr_test::model_config;

std::vector<std::byte> encode(const dcr::tensor_registry& reg, std::uint32_t sequence,
                              const std::vector<item>& items, std::uint32_t attempt = 0) {
  dcr::payload_header h;
  h.id = dcr::payload_id{{0, 1, attempt}, 7, sequence};
  h.registry_fingerprint = reg.fingerprint();
  std::vector<std::byte> out;
  dcr::payload_encoder().encode(h, items, reg, out);
  return out;
}

}  // namespace

TEST_CASE("receiver: overwrite-only tensors, refusal before any write, options per payload") {
  model_config c;
  c.tie = model_config::tie_mode::write_both;  // embed and lm_head share storage
  const dcr::tensor_registry reg(dcr_test::canonical_tensors(c));
  std::mt19937_64 rng(11);
  const auto m = dcr_test::random_versions(rng, reg, 0.2, &c);
  dcr_test::test_engine_loader loader(c, 2, 0), reference(c, 2, 0);
  dcr::receiver<dcr_test::test_engine_loader> rx(reg, loader), dense(reg, reference);
  CHECK(rx.overwrite_only_tensors().empty());  // not known before prewarm
  CHECK(rx.options().path == apply_path::compiled);
  dcr_test::dense_load_all(rx, reg, m.old_words);
  dcr_test::dense_load_all(dense, reg, m.new_words);
  rx.prewarm();

  const auto list = rx.overwrite_only_tensors();
  CHECK(std::is_sorted(list.begin(), list.end()));
  std::vector<tensor_id> expected;
  for (const auto& r : rx.placement_report())
    if (r.overwrite_only) expected.push_back(r.tensor);
  CHECK(std::vector<tensor_id>(list.begin(), list.end()) == expected);
  // Tied embeddings and the cast norm copies.
  for (const char* name : {"lm_head.weight", "model.embed_tokens.weight",
                           "model.layers.0.input_layernorm.weight"})
    CHECK(std::binary_search(list.begin(), list.end(), reg.id(name)));

  // Items as an owner told the list would build them, plus one xor item it must not send.
  std::vector<item> good, bad;
  for (tensor_id id = 0; id < reg.size(); ++id) {
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) idx.push_back(i);
    const bool ow = std::binary_search(list.begin(), list.end(), id);
    good.push_back(dcr_test::hand_item(id, reg.at(id), ow ? encoding::overwrite : encoding::xor_mask, idx, m));
  }
  bad.push_back(good[reg.id("model.layers.0.self_attn.q_proj.weight")]);
  bad.push_back(dcr_test::hand_item(reg.id("model.embed_tokens.weight"),
                                    reg.at(reg.id("model.embed_tokens.weight")), encoding::xor_mask,
                                    good[reg.id("model.embed_tokens.weight")].indices, m));
  rx.begin_attempt({0, 1, 0});
  const engine_storage before = loader.storage();
  CHECK(dcr_test::code_of([&] { rx.apply_payload(encode(reg, 0, bad)); }) ==
        errc::unsupported_loader_path);
  CHECK(loader.storage() == before);
  CHECK(rx.stats().payloads_applied == 0);

  // The good items in two payloads: the general path with checks, then the default.
  const std::vector<item> first(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2));
  const std::vector<item> second(good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2), good.end());
  CHECK(rx.apply_payload(encode(reg, 1, first), apply_options{apply_path::general, true}) ==
        dcr::apply_outcome::applied);
  CHECK(rx.stats().verified == rx.stats().writes);
  rx.set_options({apply_path::compiled, true});
  CHECK(rx.apply_payload(encode(reg, 2, second)) == dcr::apply_outcome::applied);
  CHECK(rx.stats().verified == rx.stats().writes);
  CHECK(rx.stats().payloads_applied == 2);
  CHECK(loader.storage() == reference.storage());
}

TEST_CASE("receiver: a payload that fails after its writes began fences the rest of its attempt") {
  // Tied tensors (one storage) whose overwrite items disagree fail the post-apply check after
  // the writes; an xor item in the same payload has been applied by then. Applying that
  // payload again (an agent's refetch) would apply the xor records twice and restore the old
  // bits, so the receiver refuses every later payload of the attempt; the next attempt is
  // accepted (the protocol's retry rewrites the union of changes by overwrite).
  model_config c;
  c.tie = model_config::tie_mode::write_both;
  const dcr::tensor_registry reg(dcr_test::canonical_tensors(c));
  std::mt19937_64 rng(5);
  const auto m = dcr_test::random_versions(rng, reg, 0.2, &c);
  dcr_test::test_engine_loader loader(c, 1, 0);
  dcr::receiver<dcr_test::test_engine_loader> rx(reg, loader);
  dcr_test::dense_load_all(rx, reg, m.old_words);
  rx.prewarm();
  rx.set_options({apply_path::compiled, true});
  const auto changed = [&](tensor_id id) {
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) idx.push_back(i);
    return idx;
  };
  const auto q = reg.id("model.layers.0.self_attn.q_proj.weight");
  const auto embed = reg.id("model.embed_tokens.weight"), lm = reg.id("lm_head.weight");
  REQUIRE(!changed(q).empty());
  REQUIRE(!changed(embed).empty());
  item xq = dcr_test::hand_item(q, reg.at(q), encoding::xor_mask, changed(q), m);
  item a = dcr_test::hand_item(embed, reg.at(embed), encoding::overwrite, changed(embed), m);
  item b = dcr_test::hand_item(lm, reg.at(lm), encoding::overwrite, changed(embed), m);
  b.values[0] = static_cast<std::byte>(~static_cast<unsigned>(b.values[0]) & 0xffu);
  const auto failing = encode(reg, 0, {xq, a, b});
  const auto other = encode(reg, 1, {dcr_test::hand_item(embed, reg.at(embed), encoding::overwrite, changed(embed), m)});

  rx.begin_attempt({0, 1, 0});
  CHECK(dcr_test::code_of([&] { rx.apply_payload(failing); }) == errc::verification_failed);
  const engine_storage after_first = loader.storage();
  // The same bytes again, and another payload of the attempt: refused, nothing written.
  for (const auto* bytes : {&failing, &other}) {
    CHECK(dcr_test::code_of([&] { rx.apply_payload(*bytes); }) == errc::verification_failed);
    CHECK(dcr_test::message_of([&] { rx.apply_payload(*bytes); }).find("refused from here on") !=
          std::string::npos);
    CHECK(loader.storage() == after_first);
  }
  rx.begin_attempt({0, 1, 0});  // the same attempt begun again stays refused
  CHECK(dcr_test::code_of([&] { rx.apply_payload(other); }) == errc::verification_failed);
  CHECK(rx.stats().attempt_payloads == 0);

  // The retry: accepted again.
  rx.begin_attempt({0, 1, 1});
  CHECK(rx.apply_payload(encode(reg, 0, {a}, 1)) == dcr::apply_outcome::applied);
  CHECK(rx.stats().attempt_payloads == 1);
}
