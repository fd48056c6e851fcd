// item_applier: loader conditions are checked at prewarm (naming the tensor), an item a loader
// path cannot take is refused before anything is written, skips are explicit, and post-apply
// checks catch a write that does not hold what its record prescribes. Both apply paths.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "test_engine.hpp"
#include "test_models.hpp"

namespace {

using dcr::apply_options;
using dcr::apply_path;
using dcr::dtype;
using dcr::encoding;
using dcr::errc;
using dcr::item;
using dcr::item_applier;
using dcr::tensor_id;
using dcr::tensor_registry;
using dcr_test::code_of;
using dcr_test::engine_storage;
using dcr_test::fault;
using dcr_test::message_of;
using dcr_test::model_config;
using dcr_test::model_versions;
using dcr_test::narrow;
using dcr_test::test_engine_loader;

constexpr apply_path both_paths[] = {apply_path::compiled, apply_path::general};

/// A fixed small model on rank 1 of 2, dense-loaded with its old weights.
struct fixture {
  model_config c;
  tensor_registry reg;
  model_versions m;
  test_engine_loader loader;
  item_applier<test_engine_loader> applier;

  explicit fixture(model_config config = {})
      : c(config), reg(dcr_test::canonical_tensors(c)), loader(c, 2, 1), applier(reg, loader) {
    std::mt19937_64 rng(99);
    m = dcr_test::random_versions(rng, reg, 0.3, &c);
    dcr_test::dense_load_all(applier, reg, m.old_words);
  }
  /// An item of every changed element of `name` at index `from` or above.
  item changes_of(std::string_view name, encoding enc, std::uint64_t from = 0) {
    const tensor_id id = reg.id(name);
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = from; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) idx.push_back(i);
    REQUIRE_FALSE(idx.empty());
    return dcr_test::hand_item(id, reg.at(id), enc, idx, m);
  }
  /// The storage a dense load produces with `names` at their new words, the rest old.
  engine_storage dense_with_new(std::initializer_list<const char*> names, fault inject = fault::none) {
    model_versions mixed = m;
    for (auto name : names) mixed.old_words[reg.id(name)] = m.new_words[reg.id(name)];
    test_engine_loader other(c, 2, 1);
    other.inject = inject;
    item_applier<test_engine_loader> ap(reg, other);
    dcr_test::dense_load_all(ap, reg, mixed.old_words);
    return other.storage();
  }
};

/// prewarm() under `inject` on `tensor` fails with `code`, naming the tensor.
void expect_prewarm_error(fault inject, const std::string& tensor, errc code) {
  fixture f;
  f.loader.inject = inject;
  f.loader.fault_tensor = tensor;
  const std::string what = message_of([&] { f.applier.prewarm(); });
  CAPTURE(what);
  CHECK(code_of([&] { f.applier.prewarm(); }) == code);
  CHECK(what.find(tensor) != std::string::npos);
  CHECK_FALSE(f.applier.prewarmed());
}

}  // namespace

TEST_CASE("apply before prewarm is refused") {
  fixture f;
  std::vector<item> items{f.changes_of("model.norm.weight", encoding::overwrite)};
  CHECK(code_of([&] { f.applier.apply(items); }) == errc::not_ready);
  CHECK(code_of([&] { (void)f.applier.overwrite_only_tensors(); }) == errc::not_ready);
}

TEST_CASE("loader conditions are checked at prewarm, with the tensor named") {
  // A copy from a temporary: its elements cannot be located by address.
  expect_prewarm_error(fault::temporary_src, "model.layers.0.mlp.up_proj.weight",
                       errc::unsupported_loader_path);
  // A broadcast src: one canonical element would feed several destinations of one copy.
  expect_prewarm_error(fault::broadcast_src, "model.layers.0.self_attn.o_proj.weight",
                       errc::unsupported_loader_path);
  // A loader that writes into its input.
  expect_prewarm_error(fault::modify_src, "model.layers.0.mlp.down_proj.weight",
                       errc::unsupported_loader_path);
  // Two loads of the same tensor place it differently.
  expect_prewarm_error(fault::alternate, "model.layers.0.self_attn.q_proj.weight",
                       errc::unsupported_loader_path);
  // Two different canonical elements written into one destination element.
  expect_prewarm_error(fault::reversed_norm, "model.norm.weight", errc::unsupported_loader_path);
  // A cast that does not read the tensor's dtype.
  expect_prewarm_error(fault::wrong_cast, "model.layers.0.input_layernorm.weight",
                       errc::dtype_mismatch);
  // Neither a copy nor a skip for experts this rank does not hold.
  expect_prewarm_error(fault::forget_skip, "model.layers.0.mlp.experts.0.down_proj.weight",
                       errc::unsupported_loader_path);
}

TEST_CASE("a loader that starts misbehaving after prewarm") {
  fixture f;
  f.applier.prewarm();
  f.loader.inject = fault::temporary_src;
  f.loader.fault_tensor = "model.layers.0.mlp.up_proj.weight";
  const engine_storage before = f.loader.storage();
  std::vector<item> items{f.changes_of("model.layers.0.mlp.gate_proj.weight", encoding::xor_mask),
                          f.changes_of("model.layers.0.mlp.up_proj.weight", encoding::xor_mask)};
  // The general path runs the loader per item: its check pass catches the temporary, and the
  // valid item ahead of it in the same payload is not written either.
  CHECK(code_of([&] { f.applier.apply(items, {apply_path::general, false}); }) ==
        errc::unsupported_loader_path);
  CHECK(f.loader.storage() == before);
  // The compiled path does not call the loader: it applies the placement compiled at prewarm.
  CHECK(f.applier.apply(items, {apply_path::compiled, true}).writes > 0);
  CHECK(f.loader.storage() ==
        f.dense_with_new({"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}));
  // A dense load through the misbehaving loader is fine: only the delta paths need addresses.
  const auto id = f.reg.id("model.layers.0.mlp.up_proj.weight");
  const auto v = narrow<std::uint16_t>(f.m.new_words[id]);
  const auto r = f.applier.dense_load<std::uint16_t>(
      id, dcr::tensor_view<const std::uint16_t>::contiguous(v.data(), f.reg.at(id).shape));
  CHECK(r.copies == 1);

  // A nondeterministic loader on the general path is caught between its two passes.
  fixture g;
  g.applier.prewarm();
  g.loader.inject = fault::alternate;
  g.loader.fault_tensor = "model.layers.0.self_attn.q_proj.weight";
  std::vector<item> q{g.changes_of("model.layers.0.self_attn.q_proj.weight", encoding::overwrite)};
  CHECK(code_of([&] { g.applier.apply(q, {apply_path::general, false}); }) ==
        errc::unsupported_loader_path);
}

TEST_CASE("a tensor written twice is overwrite-only: xor/ulp refused before any write") {
  for (apply_path path : both_paths) {
    CAPTURE(static_cast<int>(path));
    fixture f;
    f.loader.inject = fault::duplicate_norm;
    f.applier.prewarm();
    const auto norm = f.reg.id("model.norm.weight");
    const auto& rep = f.applier.plan().at(norm);
    CHECK(rep.overwrite_only);
    CHECK(rep.reason.find("more than once") != std::string::npos);
    CHECK(std::binary_search(f.applier.overwrite_only_tensors().begin(),
                             f.applier.overwrite_only_tensors().end(), norm));
    const engine_storage before = f.loader.storage();
    for (encoding enc : dcr_test::supported_encodings()) {
      if (enc == encoding::overwrite) continue;
      std::vector<item> items{f.changes_of("lm_head.weight", enc),
                              f.changes_of("model.norm.weight", enc)};
      const std::string what = message_of([&] { f.applier.apply(items, {path, false}); });
      CHECK(code_of([&] { f.applier.apply(items, {path, false}); }) == errc::unsupported_loader_path);
      CHECK(what.find("model.norm.weight") != std::string::npos);
      CHECK(f.loader.storage() == before);
    }
    // The same change as overwrite writes the norm buffer twice with the same bits: exact.
    std::vector<item> ow{f.changes_of("lm_head.weight", encoding::xor_mask),
                         f.changes_of("model.norm.weight", encoding::overwrite)};
    const auto s = f.applier.apply(ow, {path, true});
    CHECK(s.verified == s.writes);
    CHECK(f.loader.storage() == f.dense_with_new({"lm_head.weight", "model.norm.weight"},
                                                 fault::duplicate_norm));
  }
}

TEST_CASE("cast copies: overwrite stores cast(new bits), xor/ulp are refused") {
  for (dtype norm : {dtype::bf16, dtype::f16, dtype::f32}) {
    model_config c;
    c.norm_type = norm;
    c.type = dtype::bf16;
    for (apply_path path : both_paths) {
      fixture f(c);
      f.applier.prewarm();
      const char* ln = "model.layers.0.input_layernorm.weight";
      const auto& rep = f.applier.plan().at(f.reg.id(ln));
      CHECK(rep.overwrite_only);
      CHECK(rep.reason.find("cast") != std::string::npos);
      CHECK(rep.copies == 2);
      CHECK_FALSE(f.applier.plan().overwrite_only(f.reg.id("model.norm.weight")));
      const engine_storage before = f.loader.storage();
      std::vector<item> x{f.changes_of(ln, encoding::xor_mask)};
      CHECK(code_of([&] { f.applier.apply(x, {path, false}); }) == errc::unsupported_loader_path);
      CHECK(f.loader.storage() == before);
      std::vector<item> o{f.changes_of(ln, encoding::overwrite)};
      f.applier.apply(o, {path, true});
      CHECK(f.loader.storage() == f.dense_with_new({ln}));
    }
  }
}

namespace {

/// "w" (bf16 [4, 8]) split by rows over `world` ranks, each rank keeping its rows twice: as
/// bf16 and, through a cast copy, as f32; "n" (bf16 [8]) replicated, copied as is. With 4 rows
/// over 5 ranks, rank 4's share of "w" is empty, and its loader still issues both copies (with
/// zero elements), as an engine's loader slicing its share does.
struct empty_share_loader {
  using loader_concept = dcr::loader_tag;
  int world = 5, rank = 0;
  std::vector<std::uint16_t> rows = std::vector<std::uint16_t>(32, 0);
  std::vector<std::uint32_t> rows_f32 = std::vector<std::uint32_t>(32, 0);
  std::vector<std::uint16_t> norm = std::vector<std::uint16_t>(8, 0);

  bool operator==(const empty_share_loader& o) const {
    return rows == o.rows && rows_f32 == o.rows_f32 && norm == o.norm;
  }

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    if constexpr (std::is_same_v<W, std::uint16_t>) {
      if (t.name == "n") return sink.copy(dcr::tensor_view<W>::contiguous(norm.data(), {8}), src);
      const auto r = dcr::balanced_split(4, world, rank);
      const auto mine = src.slice(0, r.begin, r.size());
      sink.copy(dcr::tensor_view<W>::contiguous(rows.data(), {r.size(), 8}), mine);
      sink.copy(dcr::tensor_view<std::uint32_t>::contiguous(rows_f32.data(), {r.size(), 8}), mine,
                dcr::element_transform::cast(dtype::bf16, dtype::f32));
    } else {
      sink.skip(t);  // the registry holds bf16 tensors only
    }
  }
};

}  // namespace

TEST_CASE("an empty share's zero-element cast copy sets no condition: both paths agree") {
  // 4 rows over 5 ranks. A rank holding rows of "w" takes it as overwrite only (its cast copy
  // does not preserve bits) and both paths refuse xor/ulp items of it before any write. Rank 4
  // holds none: its empty copies place no element, so the cast sets no condition there. Both
  // paths accept the xor/ulp item and write nothing, which is what a dense load writes.
  const tensor_registry reg({{"w", dtype::bf16, {4, 8}}, {"n", dtype::bf16, {8}}});
  const auto w = reg.id("w"), n = reg.id("n");
  std::mt19937_64 rng(45);
  const model_versions m = dcr_test::random_versions(rng, reg, 1.0);
  const auto all = [&](tensor_id id) {
    std::vector<std::uint64_t> idx(m.old_words[id].size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    return idx;
  };
  const auto item_of = [&](tensor_id id, encoding enc) {
    return dcr_test::hand_item(id, reg.at(id), enc, all(id), m);
  };
  for (int rank = 0; rank < 5; ++rank) {
    const auto share = dcr::balanced_split(4, 5, rank).size();
    const bool holds = share > 0;
    CAPTURE(rank);
    empty_share_loader dense{5, rank};
    item_applier<empty_share_loader> dense_ap(reg, dense);
    dcr_test::dense_load_all(dense_ap, reg, m.new_words);
    for (apply_path path : both_paths) {
      CAPTURE(static_cast<int>(path));
      empty_share_loader l{5, rank};
      item_applier<empty_share_loader> ap(reg, l, {path, false});
      dcr_test::dense_load_all(ap, reg, m.old_words);
      ap.prewarm();
      const auto& rep = ap.plan().at(w);
      CHECK(rep.copies == 2);
      CHECK(rep.elements == static_cast<std::uint64_t>(2 * 8 * share));
      CHECK(rep.overwrite_only == holds);
      CHECK(ap.plan().overwrite_only_tensors().size() == (holds ? 1u : 0u));
      CHECK_FALSE(ap.plan().overwrite_only(n));
      for (encoding enc : dcr_test::supported_encodings()) {
        if (enc == encoding::overwrite) continue;
        CAPTURE(static_cast<int>(enc));
        std::vector<item> items{item_of(n, encoding::xor_mask), item_of(w, enc)};
        const empty_share_loader before = l;
        if (holds) {
          CHECK(code_of([&] { ap.apply(items, {path, true}); }) == errc::unsupported_loader_path);
          CHECK(message_of([&] { ap.apply(items, {path, true}); }).find("'w'") != std::string::npos);
          CHECK(l == before);
        } else {
          const auto s = ap.apply(items, {path, true});
          CHECK(s.items == 2);
          CHECK(s.writes == 8);  // all of "n", nothing of "w"
          CHECK(s.verified == s.writes);
          CHECK(s.skipped_items == 0);
          CHECK(l.rows == before.rows);
          CHECK(l.rows_f32 == before.rows_f32);
          CHECK(l == dense);
          // Back to the old bits of "n" for the next encoding (xor is its own inverse).
          std::vector<item> undo{item_of(n, encoding::xor_mask)};
          ap.apply(undo, {path, false});
        }
      }
      // Overwrite items go through on every rank and give the dense refit.
      std::vector<item> ow{item_of(n, encoding::xor_mask), item_of(w, encoding::overwrite)};
      const auto s = ap.apply(ow, {path, true});
      CHECK(s.writes == static_cast<std::uint64_t>(8 + 2 * 8 * share));
      CHECK(s.verified == s.writes);
      CHECK(l == dense);
    }
  }
}

TEST_CASE("tied embeddings: skipped lm_head, or both written into one storage") {
  {
    model_config c;
    c.tie = model_config::tie_mode::skip_lm_head;
    fixture f(c);
    f.applier.prewarm();
    const auto lm = f.reg.id("lm_head.weight");
    CHECK(f.applier.skips(lm));
    CHECK_FALSE(f.applier.plan().overwrite_only(lm));
    const engine_storage before = f.loader.storage();
    std::vector<item> items{f.changes_of("lm_head.weight", encoding::xor_mask)};
    CHECK(f.applier.apply(items).skipped_items == 1);
    CHECK(f.loader.storage() == before);
  }
  model_config c;
  c.tie = model_config::tie_mode::write_both;
  for (apply_path path : both_paths) {
    fixture f(c);  // random_versions keeps lm_head bit-equal to embed, as a tied checkpoint does
    f.applier.prewarm();
    const auto lm = f.reg.id("lm_head.weight"), embed = f.reg.id("model.embed_tokens.weight");
    CHECK(f.applier.plan().at(lm).reason.find("model.embed_tokens.weight") != std::string::npos);
    CHECK(f.applier.plan().at(embed).reason.find("lm_head.weight") != std::string::npos);
    const auto list = f.applier.overwrite_only_tensors();
    CHECK(std::binary_search(list.begin(), list.end(), lm));
    CHECK(std::binary_search(list.begin(), list.end(), embed));
    const engine_storage before = f.loader.storage();
    std::vector<item> x{f.changes_of("model.embed_tokens.weight", encoding::xor_mask)};
    CHECK(code_of([&] { f.applier.apply(x, {path, false}); }) == errc::unsupported_loader_path);
    CHECK(f.loader.storage() == before);
    std::vector<item> o{f.changes_of("lm_head.weight", encoding::overwrite),
                        f.changes_of("model.embed_tokens.weight", encoding::overwrite)};
    const auto s = f.applier.apply(o, {path, true});
    CHECK(s.verified == s.writes);
    CHECK(f.loader.storage() == f.dense_with_new({"lm_head.weight", "model.embed_tokens.weight"}));
  }
}

TEST_CASE("the tied-weights trap: lm_head written into the embedding's storage, undeclared") {
  // The engine shares one storage for both tensors but does not declare them tied (a loader
  // that writes lm_head into the embedding by mistake looks the same). Accepting it as a tie
  // committed a non-dense result only verify caught; prewarm refuses it, naming both tensors,
  // the storage bytes and the declaration that would accept it.
  model_config c;
  c.tie = model_config::tie_mode::write_both;
  fixture f(c);
  f.loader.declare_tie = false;
  const std::string what = message_of([&] { f.applier.prewarm(); });
  CAPTURE(what);
  CHECK(code_of([&] { f.applier.prewarm(); }) == errc::unsupported_loader_path);
  CHECK(what.find("'model.embed_tokens.weight'") != std::string::npos);
  CHECK(what.find("'lm_head.weight'") != std::string::npos);
  CHECK(what.find("destination bytes [0x") != std::string::npos);
  CHECK(what.find("tied_tensors()") != std::string::npos);
  CHECK_FALSE(f.applier.prewarmed());
  // Declared, the same loader is accepted with both tensors overwrite-only.
  f.loader.declare_tie = true;
  f.applier.prewarm();
  CHECK(f.applier.plan().overwrite_only(f.reg.id("lm_head.weight")));
  CHECK(f.applier.plan().overwrite_only(f.reg.id("model.embed_tokens.weight")));
}

TEST_CASE("post-apply checks name the tensor and element of a write that does not hold") {
  // Tied tensors whose items disagree: the second overwrite replaces the first one's bits, so
  // the first write no longer holds its record's value.
  model_config c;
  c.tie = model_config::tie_mode::write_both;
  for (apply_path path : both_paths) {
    fixture f(c);
    f.applier.prewarm();
    // Only vocab rows this rank (1 of 2) holds.
    const auto from =
        static_cast<std::uint64_t>(dcr::balanced_split(f.c.vocab, 2, 1).begin * f.c.hidden);
    item a = f.changes_of("model.embed_tokens.weight", encoding::overwrite, from);
    item b = f.changes_of("lm_head.weight", encoding::overwrite, from);
    b.values[0] = static_cast<std::byte>(~static_cast<unsigned>(b.values[0]) & 0xffu);
    std::vector<item> items{a, b};
    const std::string what = message_of([&] { f.applier.apply(items, {path, true}); });
    CHECK(code_of([&] { f.applier.apply(items, {path, true}); }) == errc::verification_failed);
    CHECK(what.find("model.embed_tokens.weight") != std::string::npos);
    CHECK(what.find("element " + std::to_string(a.indices[0])) != std::string::npos);
    // Without checks the same apply goes through (last write wins, as in a dense load order).
    CHECK(code_of([&] { f.applier.apply(items, {path, false}); }) == errc::ok);
  }
}

TEST_CASE("experts another rank holds are skipped, explicitly") {
  for (apply_path path : both_paths) {
    fixture f;  // rank 1 of 2 with 4 experts: holds experts 2 and 3
    f.applier.set_options({path, false});
    f.applier.prewarm();
    const auto e0 = f.reg.id("model.layers.0.mlp.experts.0.gate_proj.weight");
    const auto e3 = f.reg.id("model.layers.0.mlp.experts.3.gate_proj.weight");
    CHECK(f.applier.skips(e0));
    CHECK_FALSE(f.applier.skips(e3));
    CHECK(f.applier.plan().at(e0).skipped);
    CHECK(f.applier.plan().at(e0).placements == 0);
    const engine_storage before = f.loader.storage();
    std::vector<item> items{f.changes_of("model.layers.0.mlp.experts.0.gate_proj.weight", encoding::xor_mask),
                            f.changes_of("model.layers.0.mlp.experts.1.down_proj.weight", encoding::overwrite)};
    const auto s = f.applier.apply(items);
    CHECK(s.items == 2);
    CHECK(s.skipped_items == 2);
    CHECK(s.writes == 0);
    CHECK(f.loader.storage() == before);
    // Dense loads report the skip too.
    const auto& t = f.reg.at(e0);
    const auto v = narrow<std::uint16_t>(f.m.new_words[e0]);
    const auto r = f.applier.dense_load<std::uint16_t>(
        e0, dcr::tensor_view<const std::uint16_t>::contiguous(v.data(), t.shape));
    CHECK(r.skipped);
    CHECK(r.copies == 0);
    CHECK(f.loader.storage() == before);
  }
}

TEST_CASE("an item without records writes nothing") {
  for (apply_path path : both_paths) {
    fixture f;
    f.applier.prewarm();
    const engine_storage before = f.loader.storage();
    item empty;
    empty.tensor = f.reg.id("model.layers.0.self_attn.q_proj.weight");
    empty.type = f.c.type;
    empty.enc = encoding::xor_mask;
    const auto s = f.applier.apply(std::span<const item>(&empty, 1), {path, true});
    CHECK(s.items == 1);
    CHECK(s.records == 0);
    CHECK(s.writes == 0);
    CHECK(s.skipped_items == 0);
    CHECK(f.loader.storage() == before);
    CHECK(f.applier.apply({}).items == 0);
  }
}

TEST_CASE("malformed items are refused before any write") {
  for (apply_path path : both_paths) {
    fixture f;
    f.applier.prewarm();
    const engine_storage before = f.loader.storage();
    const item good = f.changes_of("model.layers.0.self_attn.o_proj.weight", encoding::xor_mask);
    auto with_bad = [&](auto mutate) {
      item bad = f.changes_of("model.layers.0.self_attn.k_proj.weight", encoding::overwrite);
      mutate(bad);
      std::vector<item> items{good, bad};
      return code_of([&] { f.applier.apply(items, {path, true}); });
    };
    CHECK(with_bad([](item& it) { it.tensor = 100000; }) == errc::unknown_tensor);
    CHECK(with_bad([](item& it) { it.type = dtype::f32; }) == errc::dtype_mismatch);
    CHECK(with_bad([](item& it) { it.values.pop_back(); }) == errc::invalid_argument);
    CHECK(with_bad([](item& it) { it.enc = static_cast<encoding>(9); }) == errc::unsupported_version);
    CHECK(with_bad([](item& it) { std::swap(it.indices.front(), it.indices.back()); }) ==
          errc::invalid_argument);
    CHECK(with_bad([&](item& it) { it.indices.back() = 1u << 30; }) == errc::out_of_range);
    // Indices at or above 2^63 (the branch-free check's edge: 2^63 + 10 before a small index
    // wraps to a difference with a clear top bit), first and last.
    CHECK(with_bad([](item& it) { it.indices.front() = (std::uint64_t{1} << 63) + 10; }) ==
          errc::invalid_argument);
    CHECK(with_bad([](item& it) { it.indices.back() = std::uint64_t{1} << 63; }) ==
          errc::out_of_range);
    // An xor item for a tensor this rank takes as overwrite only (its norm has a cast copy).
    CHECK(with_bad([&](item& it) {
            it = f.changes_of("model.layers.0.input_layernorm.weight", encoding::xor_mask);
          }) == errc::unsupported_loader_path);
    CHECK(f.loader.storage() == before);
  }
}

TEST_CASE("the default path is compiled; options switch per apply") {
  fixture f;
  CHECK(f.applier.options().path == apply_path::compiled);
  CHECK_FALSE(f.applier.options().verify);
  f.applier.prewarm();
  std::vector<item> a{f.changes_of("model.layers.0.self_attn.v_proj.weight", encoding::xor_mask)};
  std::vector<item> b{f.changes_of("model.layers.0.mlp.down_proj.weight", encoding::xor_mask)};
  CHECK(f.applier.apply(a).verified == 0);
  f.applier.set_options({apply_path::general, true});
  const auto s = f.applier.apply(b);
  CHECK(s.verified == s.writes);
  CHECK(s.writes > 0);
  CHECK(f.loader.storage() == f.dense_with_new({"model.layers.0.self_attn.v_proj.weight",
                                                "model.layers.0.mlp.down_proj.weight"}));
}

TEST_CASE("dense_load checks the word width and the shape") {
  fixture f;
  const auto id = f.reg.id("model.norm.weight");  // f32
  std::vector<std::uint16_t> w16(static_cast<std::size_t>(f.c.hidden));
  std::vector<std::uint32_t> w32(static_cast<std::size_t>(f.c.hidden + 1));
  CHECK(code_of([&] {
          f.applier.dense_load<std::uint16_t>(
              id, dcr::tensor_view<const std::uint16_t>::contiguous(w16.data(), {f.c.hidden}));
        }) == errc::dtype_mismatch);
  CHECK(code_of([&] {
          f.applier.dense_load<std::uint32_t>(
              id, dcr::tensor_view<const std::uint32_t>::contiguous(w32.data(), {f.c.hidden + 1}));
        }) == errc::shape_mismatch);
  const auto r = f.applier.dense_load<std::uint32_t>(
      id, dcr::tensor_view<const std::uint32_t>::contiguous(w32.data(), {f.c.hidden}));
  CHECK(r.copies == 2);  // norm and norm_copy
  CHECK(r.elements == static_cast<std::uint64_t>(2 * f.c.hidden));
}
