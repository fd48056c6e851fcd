// item_applier: applying items in place through the engine's own loader leaves every rank's
// storage bit-identical to a dense refit through the same loader; a loader path an item cannot
// take is rejected before anything is written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "test_engine.hpp"

namespace {

using dcr::dtype;
using dcr::encoding;
using dcr::errc;
using dcr::item;
using dcr::item_applier;
using dcr::tensor_id;
using dcr::tensor_registry;
using dcr_test::engine_storage;
using dcr_test::fault;
using dcr_test::model_config;
using dcr_test::test_engine_loader;

/// Old and new words of every canonical tensor (widened to 64 bits), by tensor id.
struct model_versions {
  std::vector<std::vector<std::uint64_t>> old_words, new_words;
};

template <dcr::storage_word W>
std::vector<W> narrow(const std::vector<std::uint64_t>& v) {
  std::vector<W> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<W>(v[i]);
  return out;
}

/// Random old weights (specials mixed in) and new weights with each element changed with
/// probability `rate` (every element when rate == 1).
model_versions random_versions(std::mt19937_64& rng, const tensor_registry& reg, double rate) {
  model_versions m;
  std::bernoulli_distribution changes(rate);
  for (const auto& t : reg.tensors()) {
    auto& o = m.old_words.emplace_back(static_cast<std::size_t>(t.numel()));
    auto& n = m.new_words.emplace_back();
    dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      for (auto& x : o) x = dcr_test::random_word<W>(rng, t.type);
      n = o;
      for (auto& x : n)
        if (rate >= 1.0 || changes(rng)) x = dcr_test::changed_word<W>(rng, t.type, static_cast<W>(x));
    });
  }
  return m;
}

/// An item built by hand: value = old ^ new (xor_mask) or new (overwrite).
item hand_item(tensor_id id, const dcr::canonical_tensor& t, encoding enc,
               const std::vector<std::uint64_t>& indices, const model_versions& m) {
  item it;
  it.tensor = id;
  it.type = t.type;
  it.enc = enc;
  it.indices = indices;
  it.values.resize(indices.size() * dcr::dtype_size(t.type));
  dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
    using W = decltype(w);
    auto out = it.words<W>();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const auto o = static_cast<W>(m.old_words[id][indices[k]]);
      const auto n = static_cast<W>(m.new_words[id][indices[k]]);
      out[k] = enc == encoding::xor_mask ? static_cast<W>(o ^ n) : n;
    }
  });
  return it;
}

/// Each tensor's changed elements split among 1-3 owners (disjoint items, random encodings),
/// plus some items without records; shuffled and cut into payloads of 1-5 items.
std::vector<std::vector<item>> random_payloads(std::mt19937_64& rng, const tensor_registry& reg,
                                               const model_versions& m) {
  std::vector<item> items;
  for (tensor_id id = 0; id < reg.size(); ++id) {
    const auto& t = reg.at(id);
    const int owners = 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<std::uint64_t>> parts(static_cast<std::size_t>(owners));
    for (std::uint64_t i = 0; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) parts[rng() % parts.size()].push_back(i);
    for (const auto& p : parts) {
      if (p.empty() && rng() % 4 != 0) continue;
      items.push_back(hand_item(id, t, rng() % 2 ? encoding::xor_mask : encoding::overwrite, p, m));
    }
  }
  std::shuffle(items.begin(), items.end(), rng);
  std::vector<std::vector<item>> payloads;
  for (std::size_t at = 0; at < items.size();) {
    const std::size_t n = std::min<std::size_t>(1 + rng() % 5, items.size() - at);
    payloads.emplace_back(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(at)),
                          std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(at + n)));
    at += n;
  }
  return payloads;
}

/// Dense refit of every tensor through the loader.
void dense_load_all(item_applier<test_engine_loader>& ap, const tensor_registry& reg,
                    const std::vector<std::vector<std::uint64_t>>& words) {
  for (tensor_id id = 0; id < reg.size(); ++id) {
    const auto& t = reg.at(id);
    dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      const auto v = narrow<W>(words[id]);
      ap.dense_load<W>(id, dcr::tensor_view<const W>::contiguous(v.data(), t.shape));
    });
  }
}

model_config random_config(std::mt19937_64& rng, dtype type) {
  auto r = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  model_config c;
  c.hidden = r(1, 40);
  c.heads = r(1, 6);
  c.kv_heads = r(1, c.heads);
  c.head_dim = r(1, 6);
  c.inter = r(1, 30);
  c.vocab = r(1, 60);
  c.experts = r(0, 5);
  c.expert_inter = r(1, 8);
  c.conv_channels = r(1, 9);
  c.conv_kernel = r(1, 4);
  c.layers = static_cast<int>(r(1, 2));
  c.type = type;
  c.norm_type = rng() % 2 ? dtype::f32 : type;
  return c;
}

/// One rank: dense(old) into A, apply every payload in place, compare with dense(new) into B.
void check_rank(const model_config& c, int world, int rank, const tensor_registry& reg,
                const model_versions& m, const std::vector<std::vector<item>>& payloads) {
  test_engine_loader la(c, world, rank), lb(c, world, rank);
  item_applier<test_engine_loader> a(reg, la), b(reg, lb);
  dense_load_all(a, reg, m.old_words);
  dense_load_all(b, reg, m.new_words);
  const engine_storage before = la.storage();
  a.prewarm();
  dcr::apply_stats total;
  std::uint64_t records = 0, items = 0;
  for (const auto& p : payloads) {
    const auto s = a.apply(p);
    total.items += s.items;
    total.records += s.records;
    total.writes += s.writes;
    total.skipped_items += s.skipped_items;
    items += p.size();
    for (const auto& it : p) records += it.count();
  }
  INFO("world ", world, " rank ", rank, " first differing buffer: ",
       engine_storage::first_difference(la.storage(), lb.storage()));
  CHECK(la.storage() == lb.storage());
  CHECK(total.items == items);
  CHECK(total.records == records);
  // Each destination word is fed by exactly one canonical element, and every record changes
  // its element, so the writes are exactly the words where dense(old) and dense(new) differ.
  CHECK(total.writes == engine_storage::differing_words(before, lb.storage()));
}

}  // namespace

TEST_CASE("in-place apply equals a dense refit byte for byte (random models, TP 1/2/4/8)") {
  std::mt19937_64 rng(20240601);
  for (int world : {1, 2, 4, 8})
    for (dtype type : {dtype::bf16, dtype::f16, dtype::f32})
      for (double rate : {0.0, 0.001, 0.01, 1.0})
        for (int rep = 0; rep < 4; ++rep) {
          const model_config c = random_config(rng, type);
          const tensor_registry reg(dcr_test::canonical_tensors(c));
          const auto m = random_versions(rng, reg, rate);
          const auto payloads = random_payloads(rng, reg, m);
          CAPTURE(world);
          CAPTURE(dcr::dtype_name(type));
          CAPTURE(rate);
          for (int rank = 0; rank < world; ++rank) check_rank(c, world, rank, reg, m, payloads);
        }
}

TEST_CASE("every transition between special bit patterns is exact, xor and overwrite") {
  for (dtype type : {dtype::bf16, dtype::f16, dtype::f32}) {
    model_config c;
    c.type = type;
    c.norm_type = type;
    const tensor_registry reg(dcr_test::canonical_tensors(c));
    std::mt19937_64 rng(7);
    model_versions m;
    for (const auto& t : reg.tensors()) {
      dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        const auto s = dcr_test::special_words<W>(t.type);
        auto& o = m.old_words.emplace_back(static_cast<std::size_t>(t.numel()));
        auto& n = m.new_words.emplace_back(o.size());
        for (std::size_t i = 0; i < o.size(); ++i) {
          // Walk all ordered pairs (a, b), a != b, of the special patterns.
          const std::size_t a = i % s.size(), b = (a + 1 + (i / s.size()) % (s.size() - 1)) % s.size();
          o[i] = s[a];
          n[i] = s[b];
        }
      });
    }
    for (encoding enc : {encoding::xor_mask, encoding::overwrite}) {
      std::vector<item> items;
      for (tensor_id id = 0; id < reg.size(); ++id) {
        std::vector<std::uint64_t> all(m.old_words[id].size());
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
        items.push_back(hand_item(id, reg.at(id), enc, all, m));
      }
      for (int world : {1, 2, 4})
        for (int rank = 0; rank < world; ++rank) check_rank(c, world, rank, reg, m, {items});
    }
  }
}

namespace {
/// A fixed small model on rank 1 of 2, dense-loaded with its old weights.
struct fixture {
  model_config c;
  tensor_registry reg{dcr_test::canonical_tensors(c)};
  model_versions m;
  test_engine_loader loader{c, 2, 1};
  item_applier<test_engine_loader> applier{reg, loader};

  fixture() {
    std::mt19937_64 rng(99);
    m = random_versions(rng, reg, 0.3);
    dense_load_all(applier, reg, m.old_words);
  }
  item changes_of(std::string_view name, encoding enc) {
    const tensor_id id = reg.id(name);
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) idx.push_back(i);
    REQUIRE_FALSE(idx.empty());
    return hand_item(id, reg.at(id), enc, idx, m);
  }
};

errc code_of(auto&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return errc::ok;
}
}  // namespace

TEST_CASE("apply before prewarm is refused") {
  fixture f;
  std::vector<item> items{f.changes_of("model.norm.weight", encoding::overwrite)};
  CHECK(code_of([&] { f.applier.apply(items); }) == errc::not_ready);
}

TEST_CASE("a loader that copies from a temporary is rejected at prewarm and at apply") {
  fixture f;
  f.loader.inject = fault::temporary_src;
  f.loader.fault_tensor = "model.layers.0.mlp.up_proj.weight";
  try {
    f.applier.prewarm();
    FAIL("prewarm accepted a loader copying from a temporary");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == errc::unsupported_loader_path);
    CHECK(std::string(e.what()).find("model.layers.0.mlp.up_proj.weight") != std::string::npos);
  }
  CHECK_FALSE(f.applier.prewarmed());

  // The loader starts misbehaving after prewarm: the check pass catches it, and the valid item
  // ahead of it in the same payload is not written either.
  f.loader.inject = fault::none;
  f.applier.prewarm();
  f.loader.inject = fault::temporary_src;
  const engine_storage before = f.loader.storage();
  std::vector<item> items{f.changes_of("model.layers.0.mlp.gate_proj.weight", encoding::xor_mask),
                          f.changes_of("model.layers.0.mlp.up_proj.weight", encoding::xor_mask)};
  CHECK(code_of([&] { f.applier.apply(items); }) == errc::unsupported_loader_path);
  CHECK(f.loader.storage() == before);
  f.loader.inject = fault::none;
  CHECK(f.applier.apply(items).writes > 0);
  // A dense load through the misbehaving loader is fine: only the delta path needs addresses.
  f.loader.inject = fault::temporary_src;
  const auto id = f.reg.id("model.layers.0.mlp.up_proj.weight");
  const auto v = narrow<std::uint16_t>(f.m.new_words[id]);
  const auto r = f.applier.dense_load<std::uint16_t>(
      id, dcr::tensor_view<const std::uint16_t>::contiguous(v.data(), f.reg.at(id).shape));
  CHECK(r.copies == 1);
}

TEST_CASE("overlapping xor writes are rejected with storage unchanged; overwrites are exact") {
  fixture f;
  f.loader.inject = fault::duplicate_norm;
  f.applier.prewarm();  // addresses of writes are only known with records
  const engine_storage before = f.loader.storage();
  std::vector<item> xor_items{f.changes_of("lm_head.weight", encoding::xor_mask),
                              f.changes_of("model.norm.weight", encoding::xor_mask)};
  try {
    f.applier.apply(xor_items);
    FAIL("overlapping xor writes were accepted");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == errc::unsupported_loader_path);
    CHECK(std::string(e.what()).find("model.norm.weight") != std::string::npos);
  }
  CHECK(f.loader.storage() == before);
  // The same change as overwrite writes the norm buffer twice with the same bits: exact.
  std::vector<item> ow_items{f.changes_of("lm_head.weight", encoding::xor_mask),
                             f.changes_of("model.norm.weight", encoding::overwrite)};
  f.applier.apply(ow_items);
  const engine_storage expected = [&] {
    // Dense-load new for these two tensors only, old for the rest.
    model_versions mixed = f.m;
    for (auto name : {"lm_head.weight", "model.norm.weight"})
      mixed.old_words[f.reg.id(name)] = f.m.new_words[f.reg.id(name)];
    test_engine_loader other(f.c, 2, 1);
    other.inject = fault::duplicate_norm;
    item_applier<test_engine_loader> ap(f.reg, other);
    dense_load_all(ap, f.reg, mixed.old_words);
    return other.storage();
  }();
  CHECK(f.loader.storage() == expected);
}

TEST_CASE("experts another rank holds are skipped, explicitly") {
  fixture f;  // rank 1 of 2 with 4 experts: holds experts 2 and 3
  f.applier.prewarm();
  const auto e0 = f.reg.id("model.layers.0.mlp.experts.0.gate_proj.weight");
  const auto e3 = f.reg.id("model.layers.0.mlp.experts.3.gate_proj.weight");
  CHECK(f.applier.skips(e0));
  CHECK_FALSE(f.applier.skips(e3));
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

  // A loader that drops a tensor without an explicit skip is refused at prewarm.
  fixture g;
  g.loader.inject = fault::forget_skip;
  CHECK(code_of([&] { g.applier.prewarm(); }) == errc::unsupported_loader_path);
}

TEST_CASE("an item without records writes nothing") {
  fixture f;
  f.applier.prewarm();
  const engine_storage before = f.loader.storage();
  item empty;
  empty.tensor = f.reg.id("model.layers.0.self_attn.q_proj.weight");
  empty.type = f.c.type;
  empty.enc = encoding::xor_mask;
  const auto s = f.applier.apply(std::span<const item>(&empty, 1));
  CHECK(s.items == 1);
  CHECK(s.records == 0);
  CHECK(s.writes == 0);
  CHECK(s.skipped_items == 0);
  CHECK(f.loader.storage() == before);
  CHECK(f.applier.apply({}).items == 0);
}

TEST_CASE("malformed items are refused before any write") {
  fixture f;
  f.applier.prewarm();
  const engine_storage before = f.loader.storage();
  const item good = f.changes_of("model.layers.0.self_attn.o_proj.weight", encoding::xor_mask);
  auto with_bad = [&](auto mutate) {
    item bad = f.changes_of("model.layers.0.self_attn.k_proj.weight", encoding::overwrite);
    mutate(bad);
    std::vector<item> items{good, bad};
    return code_of([&] { f.applier.apply(items); });
  };
  CHECK(with_bad([](item& it) { it.tensor = 100000; }) == errc::unknown_tensor);
  CHECK(with_bad([](item& it) { it.type = dtype::f32; }) == errc::dtype_mismatch);
  CHECK(with_bad([](item& it) { it.values.pop_back(); }) == errc::invalid_argument);
  CHECK(with_bad([](item& it) { it.enc = encoding::ulp; }) == errc::unsupported_version);
  CHECK(with_bad([](item& it) { std::swap(it.indices.front(), it.indices.back()); }) ==
        errc::invalid_argument);
  CHECK(with_bad([&](item& it) { it.indices.back() = 1u << 30; }) == errc::out_of_range);
  CHECK(f.loader.storage() == before);
}

TEST_CASE("a nondeterministic loader is detected on the write pass") {
  fixture f;
  f.loader.inject = fault::alternate;
  f.loader.fault_tensor = "model.layers.0.self_attn.q_proj.weight";
  f.applier.prewarm();
  std::vector<item> items{f.changes_of("model.layers.0.self_attn.q_proj.weight", encoding::overwrite)};
  // Changes at rate 0.3 reach both halves of this rank's rows, so the two passes disagree.
  CHECK(code_of([&] { f.applier.apply(items); }) == errc::unsupported_loader_path);
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
