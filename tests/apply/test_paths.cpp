// Both apply paths against the dense refit: on every engine layout of test_engine.hpp (fused
// QKV and gate/up, row-parallel o/down, transposed storage, vocab-parallel padded embeddings,
// expert-parallel experts, tied embeddings skipped or written twice, dtype-cast norm copies),
// receiver TP 1-8, dtypes bf16/f16/f32/f8_e4m3/f64 and every supported encoding, the compiled
// path, the general path and a dense refit through the same loader end byte for byte equal.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
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
using dcr_test::engine_storage;
using dcr_test::model_config;
using dcr_test::model_versions;
using dcr_test::test_engine_loader;

/// One receiver rank: its engine storage, loader and applier.
struct rank_engine {
  test_engine_loader loader;
  item_applier<test_engine_loader> applier;
  rank_engine(const model_config& c, int world, int rank, const tensor_registry& reg)
      : loader(c, world, rank), applier(reg, loader) {}
};

/// Whether every destination word is fed by one canonical element through an injective path:
/// then each record changes exactly one word per replica, and writes == differing words.
bool writes_equal_changed_words(const model_config& c) {
  const auto cast = dcr_test::cast_copy_type(c);
  const bool narrowing = cast && dcr::dtype_size(*cast) < dcr::dtype_size(c.norm_type);
  return !narrowing && c.tie != model_config::tie_mode::write_both;
}

/// Every rank: dense(old) into the compiled and the general receiver, apply every payload on
/// each path (post-apply checks on some), compare both with dense(new). Returns the union of
/// the ranks' overwrite-only tensors (what owners are told).
void check_model(std::mt19937_64& rng, const model_config& c, int world, double rate) {
  const tensor_registry reg(dcr_test::canonical_tensors(c));
  const model_versions m = dcr_test::random_versions(rng, reg, rate, &c);
  std::vector<std::unique_ptr<rank_engine>> compiled, general;
  std::set<tensor_id> overwrite_only;
  for (int rank = 0; rank < world; ++rank) {
    compiled.push_back(std::make_unique<rank_engine>(c, world, rank, reg));
    general.push_back(std::make_unique<rank_engine>(c, world, rank, reg));
    for (auto* e : {compiled.back().get(), general.back().get()}) {
      dcr_test::dense_load_all(e->applier, reg, m.old_words);
      e->applier.prewarm();
    }
    const auto list = compiled.back()->applier.overwrite_only_tensors();
    CHECK(std::is_sorted(list.begin(), list.end()));
    overwrite_only.insert(list.begin(), list.end());
  }
  const auto payloads = dcr_test::random_payloads(rng, reg, m, overwrite_only);
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    rank_engine dense(c, world, rank, reg);
    dcr_test::dense_load_all(dense.applier, reg, m.new_words);
    auto& a = *compiled[static_cast<std::size_t>(rank)];
    auto& b = *general[static_cast<std::size_t>(rank)];
    const engine_storage before = a.loader.storage();
    dcr::apply_stats sa, sb;
    std::uint64_t records = 0;
    for (const auto& p : payloads) {
      const bool verify = rng() % 2 == 0;
      const auto x = a.applier.apply(p, apply_options{apply_path::compiled, verify});
      const auto y = b.applier.apply(p, apply_options{apply_path::general, verify});
      CHECK(x.items == p.size());
      CHECK(x.writes == y.writes);
      CHECK(x.skipped_items == y.skipped_items);
      CHECK(x.verified == (verify ? x.writes : 0));
      CHECK(y.verified == (verify ? y.writes : 0));
      sa.writes += x.writes;
      sb.records += y.records;
      for (const auto& it : p) records += it.count();
    }
    INFO("compiled path, first differing buffer: ",
         engine_storage::first_difference(a.loader.storage(), dense.loader.storage()));
    CHECK(a.loader.storage() == dense.loader.storage());
    INFO("general path, first differing buffer: ",
         engine_storage::first_difference(b.loader.storage(), dense.loader.storage()));
    CHECK(b.loader.storage() == dense.loader.storage());
    CHECK(sb.records == records);
    if (writes_equal_changed_words(c))
      CHECK(sa.writes == engine_storage::differing_words(before, dense.loader.storage()));
    else
      CHECK(sa.writes >= engine_storage::differing_words(before, dense.loader.storage()));
  }
}

}  // namespace

TEST_CASE("compiled path == general path == dense refit (random layouts, TP 1-8, 5 dtypes)") {
  std::mt19937_64 rng(20240601);
  for (dtype type : {dtype::bf16, dtype::f16, dtype::f32, dtype::f8_e4m3, dtype::f64})
    for (int world = 1; world <= 8; ++world)
      for (double rate : {0.0, 0.002, 0.02, 0.3, 1.0}) {
        const model_config c = dcr_test::random_config(rng, type);
        CAPTURE(dcr::dtype_name(type));
        CAPTURE(world);
        CAPTURE(rate);
        CAPTURE(static_cast<int>(c.tie));
        CAPTURE(c.cast_copies);
        CAPTURE(dcr::dtype_name(c.norm_type));
        check_model(rng, c, world, rate);
      }
}

TEST_CASE("every layout option, every tie mode, on a fixed model") {
  std::mt19937_64 rng(5);
  for (auto tie : {model_config::tie_mode::none, model_config::tie_mode::skip_lm_head,
                   model_config::tie_mode::write_both})
    for (dtype norm : {dtype::bf16, dtype::f16, dtype::f32})
      for (dtype type : {dtype::bf16, dtype::f16})
        for (int world : {1, 3, 4}) {
          model_config c;
          c.tie = tie;
          c.norm_type = norm;
          c.type = type;
          c.layers = 2;
          CAPTURE(static_cast<int>(tie));
          CAPTURE(dcr::dtype_name(norm));
          CAPTURE(world);
          check_model(rng, c, world, 0.2);
        }
}

TEST_CASE("every transition between special bit patterns is exact on both paths") {
  for (dtype type : {dtype::bf16, dtype::f16, dtype::f32}) {
    model_config c;
    c.type = type;
    c.norm_type = type;
    const tensor_registry reg(dcr_test::canonical_tensors(c));
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
    for (encoding enc : dcr_test::supported_encodings())
      for (int world : {1, 2, 4})
        for (int rank = 0; rank < world; ++rank)
          for (apply_path path : {apply_path::compiled, apply_path::general}) {
            rank_engine e(c, world, rank, reg), dense(c, world, rank, reg);
            dcr_test::dense_load_all(e.applier, reg, m.old_words);
            dcr_test::dense_load_all(dense.applier, reg, m.new_words);
            e.applier.prewarm();
            std::vector<item> items;
            for (tensor_id id = 0; id < reg.size(); ++id) {
              std::vector<std::uint64_t> all(m.old_words[id].size());
              for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
              const bool ow = e.applier.plan().overwrite_only(id);
              items.push_back(dcr_test::hand_item(id, reg.at(id), ow ? encoding::overwrite : enc, all, m));
            }
            const auto s = e.applier.apply(items, apply_options{path, true});
            CAPTURE(dcr::dtype_name(type));
            CAPTURE(static_cast<int>(enc));
            CAPTURE(static_cast<int>(path));
            CHECK(s.verified == s.writes);
            CHECK(e.loader.storage() == dense.loader.storage());
          }
  }
}
