// tests/exec/test_exec.cpp: the exec algorithms give the same bits on every backend.
//
// Built with plain g++ against the CCCL headers, once per Thrust host system (CPP, and OMP where
// OpenMP is found): the Thrust backend (compaction by copy_if, windows by lower_bound, loops by
// for_each_n, the code shape of the CUDA backend) against the CPU policy on one and on three
// threads, and both against the library's existing CPU paths (a plain bits_differ loop,
// detect_and_gather, the mappings' operator(), make_item, the value coder's byte planes,
// item_applier's compiled apply and a dense refit), on randomized inputs: every word width,
// every mapping class, special bit patterns (+0/-0, NaN payloads, identical NaNs), change
// rates 0 to 100%.
#include <doctest/doctest.h>
#include <thrust/execution_policy.h>

#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/codec/streams.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/exec/algorithms.hpp"
#include "dcr/exec/thrust.hpp"
#include "dcr/mapping.hpp"
#include "../random_shard.hpp"
#include "test_engine.hpp"
#include "test_models.hpp"

namespace {

namespace ex = dcr::exec;

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
constexpr const char* thrust_system = "omp";
#else
constexpr const char* thrust_system = "cpp";
#endif

const auto thrust_backend = ex::on_thrust(thrust::device);
const ex::cpu_policy cpu_one = ex::cpu;
const ex::cpu_policy cpu_three = ex::cpu.on(3);

using dcr_test::make_shard;

using dcr_test::compacted;
using dcr_test::run_detect;

template <class W>
void check_detect(std::mt19937_64& rng) {
  for (std::size_t n : {0, 1, 3, 63, 64, 65, 4097, 200003})
    for (double rate : {0.0, 0.001, 0.03, 0.5, 1.0}) {
      CAPTURE(n);
      CAPTURE(rate);
      CAPTURE(sizeof(W));
      std::vector<W> tracker, candidate;
      make_shard(rng, n, rate, tracker, candidate);
      const std::uint64_t first = rng() % 1000000;
      compacted<W> ref;
      for (std::size_t i = 0; i < n; ++i)
        if (dcr::bits_differ{}(tracker[i], candidate[i])) {
          ref.index.push_back(first + i);
          ref.old_words.push_back(tracker[i]);
          ref.new_words.push_back(candidate[i]);
        }
      compacted<W> lib;
      dcr::detect_and_gather<W>(tracker, candidate, lib.index, lib.old_words, lib.new_words, first);
      CHECK(lib == ref);
      CHECK(ex::detect_compact_workspace_bytes<W>(cpu_three, n) == 0);
      CHECK(ex::detect_compact_workspace_bytes<W>(thrust_backend, n) == 0);
      CHECK(run_detect(cpu_one, tracker, candidate, first) == ref);
      CHECK(run_detect(cpu_three, tracker, candidate, first) == ref);
      CHECK(run_detect(thrust_backend, tracker, candidate, first) == ref);
      // Old and new word outputs are optional.
      std::vector<std::uint64_t> index(n);
      CHECK(ex::detect_compact(thrust_backend, tracker.data(), candidate.data(), n,
                               ex::changed_words<W>{index.data(), nullptr, nullptr}, {},
                               first) == ref.index.size());
      index.resize(ref.index.size());
      CHECK(index == ref.index);

      // Stream helpers over the changed words, every encoding, both plane layouts.
      for (dcr::encoding enc : {dcr::encoding::overwrite, dcr::encoding::xor_mask, dcr::encoding::ulp}) {
        const std::size_t m = ref.index.size();
        std::vector<W> a(m), b(m), c(m);
        ex::encode_values(cpu_one, enc, ref.old_words.data(), ref.new_words.data(), m, a.data());
        ex::encode_values(cpu_three, enc, ref.old_words.data(), ref.new_words.data(), m, b.data());
        ex::encode_values(thrust_backend, enc, ref.old_words.data(), ref.new_words.data(), m, c.data());
        CHECK(a == b);
        CHECK(a == c);
        std::vector<std::uint64_t> local(m);
        for (std::size_t k = 0; k < m; ++k) local[k] = ref.index[k] - first;
        constexpr dcr::dtype word_type = sizeof(W) == 1   ? dcr::dtype::u8
                                         : sizeof(W) == 2 ? dcr::dtype::u16
                                         : sizeof(W) == 4 ? dcr::dtype::u32
                                                          : dcr::dtype::u64;
        const auto it = dcr::make_item<W>(0, word_type, enc, local, ref.old_words, ref.new_words);
        const auto words = it.template words<W>();
        CHECK(std::vector<W>(words.begin(), words.end()) == a);
        for (bool zig : {false, true}) {
          std::vector<std::byte> p_ref(m * sizeof(W)), p_cpu(m * sizeof(W)), p_thrust(m * sizeof(W));
          if (zig)
            dcr::detail::split_byte_planes<W, true>(reinterpret_cast<const std::byte*>(a.data()), m, p_ref.data());
          else
            dcr::detail::split_byte_planes<W, false>(reinterpret_cast<const std::byte*>(a.data()), m, p_ref.data());
          ex::split_byte_planes(cpu_three, a.data(), m, zig, p_cpu.data());
          ex::split_byte_planes(thrust_backend, a.data(), m, zig, p_thrust.data());
          CHECK(p_cpu == p_ref);
          CHECK(p_thrust == p_ref);
        }
      }
      // Skips: the running sum of skip + 1 rebuilds the indices.
      const std::size_t m = ref.index.size();
      std::vector<std::uint64_t> s_cpu(m), s_thrust(m);
      ex::location_skips(cpu_one, ref.index.data(), m, s_cpu.data());
      ex::location_skips(thrust_backend, ref.index.data(), m, s_thrust.data());
      CHECK(s_cpu == s_thrust);
      std::uint64_t next = 0;
      bool rebuilt = true;
      for (std::size_t k = 0; k < m; ++k) {
        next += s_cpu[k];
        rebuilt = rebuilt && next == ref.index[k];
        ++next;
      }
      CHECK(rebuilt);
      // Tracker update: after it, every backend's tracker equals the candidate.
      std::vector<std::uint64_t> local(m);
      for (std::size_t k = 0; k < m; ++k) local[k] = ref.index[k] - first;
      for (int backend = 0; backend < 3; ++backend) {
        std::vector<W> t = tracker;
        if (backend == 0) ex::update_tracker(cpu_one, t.data(), local.data(), ref.new_words.data(), m);
        if (backend == 1) ex::update_tracker(cpu_three, t.data(), local.data(), ref.new_words.data(), m);
        if (backend == 2) ex::update_tracker(thrust_backend, t.data(), local.data(), ref.new_words.data(), m);
        CHECK(t == candidate);
      }
    }
}

TEST_CASE("detect_compact, encode helpers and tracker update agree on every backend") {
  INFO("thrust system: ", thrust_system);
  std::mt19937_64 rng(7);
  check_detect<std::uint8_t>(rng);
  check_detect<std::uint16_t>(rng);
  check_detect<std::uint32_t>(rng);
  check_detect<std::uint64_t>(rng);
}

template <class M>
void check_projection(std::mt19937_64& rng, const char* name, const M& mapping) {
  CAPTURE(name);
  const auto n = static_cast<std::size_t>(mapping.local_size());
  for (double rate : {0.0, 0.01, 0.3, 1.0}) {
    CAPTURE(rate);
    std::vector<std::uint16_t> tracker, candidate;
    make_shard(rng, n, rate, tracker, candidate);
    const auto c = run_detect(thrust_backend, tracker, candidate, 0);
    const std::size_t m = c.index.size();
    std::vector<std::uint64_t> ref_index(m);
    std::vector<std::uint32_t> ref_part(m);
    for (std::size_t k = 0; k < m; ++k) {
      const dcr::mapped_index to = mapping(c.index[k]);
      ref_index[k] = to.index;
      ref_part[k] = to.part;
    }
    for (int backend = 0; backend < 3; ++backend) {
      std::vector<std::uint64_t> index(m, ~std::uint64_t{0});
      std::vector<std::uint32_t> part(m, ~0u);
      if (backend == 0) ex::project(cpu_one, mapping, c.index.data(), m, index.data(), part.data());
      if (backend == 1) ex::project(cpu_three, mapping, c.index.data(), m, index.data(), part.data());
      if (backend == 2) ex::project(thrust_backend, mapping, c.index.data(), m, index.data(), part.data());
      CHECK(index == ref_index);
      CHECK(part == ref_part);
      // Gather the new words of the projected elements from a canonical-sized array.
      std::vector<std::uint16_t> canonical(mapping.part_size(0) * mapping.parts());
      for (std::size_t i = 0; i < canonical.size(); ++i) canonical[i] = static_cast<std::uint16_t>(i * 7);
      std::vector<std::uint64_t> flat(m);
      for (std::size_t k = 0; k < m; ++k) flat[k] = ref_part[k] * mapping.part_size(0) + ref_index[k];
      std::vector<std::uint16_t> g_cpu(m), g_thrust(m);
      ex::gather(cpu_three, canonical.data(), flat.data(), m, g_cpu.data());
      ex::gather(thrust_backend, canonical.data(), flat.data(), m, g_thrust.data());
      bool same = g_cpu == g_thrust;
      for (std::size_t k = 0; same && k < m; ++k) same = g_cpu[k] == canonical[flat[k]];
      CHECK(same);
    }
  }
}

TEST_CASE("project and gather agree on every backend for every mapping class") {
  INFO("thrust system: ", thrust_system);
  std::mt19937_64 rng(11);
  const std::int64_t shape[] = {257, 391};  // odd extents: uneven splits
  const auto n = static_cast<std::size_t>(shape[0] * shape[1]);
  check_projection(rng, "replicated", dcr::replicated(n));
  for (int world : {1, 2, 3, 8})
    for (int rank = 0; rank < world; rank += world > 2 ? 2 : 1) {
      CAPTURE(world);
      CAPTURE(rank);
      check_projection(rng, "row_split", dcr::row_split(shape, world, rank));
      check_projection(rng, "column_split", dcr::column_split(shape, world, rank));
    }
  const std::int64_t expert_shape[] = {48, 130};
  check_projection(rng, "stacked x column_split",
                   dcr::stacked(4, dcr::column_split(expert_shape, 2, 1).to_box(expert_shape)));
  check_projection(rng, "stacked x replicated",
                   dcr::stacked(3, dcr::row_split(expert_shape, 1, 0).to_box(expert_shape)));
  const std::int64_t off[] = {10, 7}, ext[] = {200, 111};
  const int axes[] = {1, 0};
  check_projection(rng, "permuted box", dcr::box(shape, off, ext, axes));
  check_projection(rng, "box", dcr::box(shape, off, ext));
}

/// Applies items through the exec backend `policy` and the receiver's compiled plan.
template <class P>
std::uint64_t apply_with(const P& policy, const dcr::placement_plan& plan,
                         std::span<const dcr::item> items) {
  std::uint64_t writes = 0;
  for (const dcr::item& it : items) {
    if (it.count() == 0 || plan.skips(it.tensor)) continue;
    const auto records = plan.placements_of(it.tensor);
    dcr::visit_word(it.word_bytes(), [&](auto w) {
      using W = decltype(w);
      writes += ex::apply_item_records<W>(policy, records.data(), records.size(), it.enc,
                                          it.indices.data(), it.count(), it.words<W>().data());
    });
  }
  return writes;
}

struct rank_engine {
  dcr_test::test_engine_loader loader;
  dcr::item_applier<dcr_test::test_engine_loader> applier;
  rank_engine(const dcr_test::model_config& c, int world, int rank, const dcr::tensor_registry& reg)
      : loader(c, world, rank), applier(reg, loader) {}
};

TEST_CASE("apply through compiled placement records: every backend == item_applier == dense") {
  INFO("thrust system: ", thrust_system);
  std::mt19937_64 rng(13);
  for (dcr::dtype type : {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32, dcr::dtype::f8_e4m3})
    for (int world : {1, 2, 3})
      for (double rate : {0.0, 0.01, 0.3, 1.0}) {
        const auto c = dcr_test::random_config(rng, type);
        CAPTURE(dcr::dtype_name(type));
        CAPTURE(world);
        CAPTURE(rate);
        const dcr::tensor_registry reg(dcr_test::canonical_tensors(c));
        const auto m = dcr_test::random_versions(rng, reg, rate, &c);
        std::vector<std::unique_ptr<rank_engine>> ref, cpu, thr;
        std::set<dcr::tensor_id> overwrite_only;
        for (int rank = 0; rank < world; ++rank)
          for (auto* v : {&ref, &cpu, &thr}) {
            v->push_back(std::make_unique<rank_engine>(c, world, rank, reg));
            dcr_test::dense_load_all(v->back()->applier, reg, m.old_words);
            v->back()->applier.prewarm();
            const auto ow = v->back()->applier.overwrite_only_tensors();
            overwrite_only.insert(ow.begin(), ow.end());
          }
        const auto payloads = dcr_test::random_payloads(rng, reg, m, overwrite_only);
        for (int rank = 0; rank < world; ++rank) {
          CAPTURE(rank);
          const auto r = static_cast<std::size_t>(rank);
          rank_engine dense(c, world, rank, reg);
          dcr_test::dense_load_all(dense.applier, reg, m.new_words);
          std::uint64_t w_ref = 0, w_cpu = 0, w_thr = 0;
          for (const auto& p : payloads) {
            w_ref += ref[r]->applier.apply(p).writes;
            w_cpu += apply_with(cpu_three, cpu[r]->applier.plan(), p);
            w_thr += apply_with(thrust_backend, thr[r]->applier.plan(), p);
          }
          CHECK(w_cpu == w_ref);
          CHECK(w_thr == w_ref);
          CHECK(ref[r]->loader.storage() == dense.loader.storage());
          INFO("cpu policy, first differing buffer: ",
               dcr_test::engine_storage::first_difference(cpu[r]->loader.storage(), dense.loader.storage()));
          CHECK(cpu[r]->loader.storage() == dense.loader.storage());
          INFO("thrust policy, first differing buffer: ",
               dcr_test::engine_storage::first_difference(thr[r]->loader.storage(), dense.loader.storage()));
          CHECK(thr[r]->loader.storage() == dense.loader.storage());
        }
      }
}

}  // namespace
