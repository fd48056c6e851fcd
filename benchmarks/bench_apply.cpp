// In-place apply on one receiver rank: the compiled path (placement records from prewarm, no
// loader call per item) against the general path (the engine's loader run per item with an
// intercepting delta_sink, check pass then write pass), in one run, at 1% and 5% of canonical
// elements changed. A dense refit of the rank through the same loader is the baseline.
//
// Layout: the test engine of tests/apply/test_engine.hpp (fused QKV and gate/up, row-parallel
// o/down with down stored transposed, vocab-parallel padded embeddings, lm_head stored
// transposed and loaded one vocab row at a time, 8 experts split over the ranks, conv weights,
// fp32 norms with a bf16 cast copy), 2 layers, hidden 2048, vocab 32000: about 580 MB of BF16
// canonical weights, of which rank 0 of tensor-parallel 2 stores about 290 MB. Every item the
// receiver gets is applied (items of the other rank's experts are skipped, as on a real rank);
// xor for tensors that take it, overwrite for the overwrite-only ones (mixed, as owners send).
// Storage, items and scratch are allocated and touched before timing; each timed iteration
// applies the same items again (xor toggles between two versions, which costs the same).
//
// Throughput is reported per changed element (items/s) and per byte: bytes = the items' record
// bytes (8-byte index plus the value word per record, what apply reads once the payload is
// decoded), and the `payload_bytes` rate counter counts the compressed payload those items
// make (one payload, default codec options). memcpy_records copies the same record bytes
// between two buffers in the same run: the baseline the apply rates are compared with.
// write_floor is the second baseline, the floor of the scattered writes: the same
// read-modify-writes (an xor of the item's value word) at the same storage addresses in the same
// order as the compiled path makes them, from an address list built before timing, with no
// decoding, search or record logic. It runs plain (range(1) == 0: the core overlaps the misses
// of independent iterations on its own) and with a software prefetch a fixed distance ahead.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/codec/payload.hpp"
#include "test_engine.hpp"

namespace {

using dcr::apply_options;
using dcr::apply_path;
using dcr::encoding;
using dcr::item;
using dcr_test::model_config;
using dcr_test::test_engine_loader;

model_config bench_config() {
  model_config c;
  c.hidden = 2048;
  c.heads = 16;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.inter = 5632;
  c.vocab = 32000;
  c.experts = 8;
  c.expert_inter = 1024;
  c.conv_channels = 64;
  c.conv_kernel = 4;
  c.layers = 2;
  c.type = dcr::dtype::bf16;
  c.norm_type = dcr::dtype::f32;
  return c;
}

struct bench_rank {
  model_config config = bench_config();
  dcr::tensor_registry registry{dcr_test::canonical_tensors(config)};
  test_engine_loader loader{config, 2, 0};
  dcr::item_applier<test_engine_loader> applier{registry, loader};
  std::vector<std::uint16_t> canonical;  // one tensor's words, for dense loads
  std::vector<item> items_1, items_5;    // 1% and 5% of every tensor's elements
  std::uint64_t records_1 = 0, records_5 = 0, on_rank_1 = 0, on_rank_5 = 0;
  std::uint64_t record_bytes_1 = 0, record_bytes_5 = 0;    // indices + values of the items
  std::uint64_t payload_bytes_1 = 0, payload_bytes_5 = 0;  // the compressed payload of them
  // write_floor's list: every write of the compiled path, in its order, by storage word width.
  struct floor_writes {
    std::vector<std::uint16_t*> at2;
    std::vector<std::uint16_t> value2;
    std::vector<std::byte*> at_other;  // other widths (fp32 norms): few, xor of the low byte
    std::vector<std::byte> value_other;
    std::uint64_t lines = 0;  // distinct 64-byte storage lines the writes touch
  } floor_1, floor_5;

  bench_rank() {
    std::mt19937_64 rng(1);
    canonical.resize(static_cast<std::size_t>(registry.max_tensor_bytes() / 2));
    for (auto& w : canonical) w = static_cast<std::uint16_t>(rng());
    dense_all();
    applier.prewarm();
    const auto ow = applier.overwrite_only_tensors();
    const std::set<dcr::tensor_id> overwrite_only(ow.begin(), ow.end());
    build_items(rng, 0.01, overwrite_only, items_1, records_1);
    build_items(rng, 0.05, overwrite_only, items_5, records_5);
    dcr::payload_encoder encoder;
    dcr::payload_header header;
    header.registry_fingerprint = registry.fingerprint();
    std::vector<std::byte> payload;
    for (auto* items : {&items_1, &items_5}) {
      std::uint64_t bytes = 0;
      for (const auto& it : *items) bytes += it.count() * (8 + it.word_bytes());
      encoder.encode(header, *items, registry, payload);
      (items == &items_1 ? record_bytes_1 : record_bytes_5) = bytes;
      (items == &items_1 ? payload_bytes_1 : payload_bytes_5) = payload.size();
    }
    // One untimed apply per path and set: code paths, log buffers and sinks are warm.
    for (auto* items : {&items_1, &items_5})
      for (apply_path p : {apply_path::compiled, apply_path::general}) {
        const auto s = applier.apply(*items, apply_options{p, false});
        (items == &items_1 ? on_rank_1 : on_rank_5) = s.writes;
      }
    gather_floor(items_1, floor_1);
    gather_floor(items_5, floor_5);
  }

  /// The storage address of every write the compiled path makes for `items`, in its order (an
  /// observer of the same per-record loop; the xor/overwrite it applies once more is untimed).
  void gather_floor(const std::vector<item>& items, floor_writes& out) {
    for (const auto& it : items) {
      if (it.count() == 0 || applier.plan().skips(it.tensor)) continue;
      dcr::visit_word(it.word_bytes(), [&](auto w) {
        using W = decltype(w);
        const W* values = it.template words<W>().data();
        dcr::apply_item_records<W>(
            applier.plan().placements_of(it.tensor), it.enc, it.indices, values,
            [&](const dcr::placement& p, std::size_t k, std::byte* at, auto) {
              if (p.dst_bytes == 2) {
                out.at2.push_back(reinterpret_cast<std::uint16_t*>(at));
                out.value2.push_back(static_cast<std::uint16_t>(values[k]));
              } else {
                out.at_other.push_back(at);
                out.value_other.push_back(static_cast<std::byte>(values[k]));
              }
            });
      });
    }
    std::vector<std::uintptr_t> lines;
    for (auto* a : out.at2) lines.push_back(reinterpret_cast<std::uintptr_t>(a) / 64);
    for (auto* a : out.at_other) lines.push_back(reinterpret_cast<std::uintptr_t>(a) / 64);
    std::sort(lines.begin(), lines.end());
    out.lines = static_cast<std::uint64_t>(std::unique(lines.begin(), lines.end()) - lines.begin());
  }

  /// Dense refit of every tensor through the loader (the canonical words are the same buffer
  /// for every tensor: the values do not matter to the time).
  std::uint64_t dense_all() {
    std::uint64_t elements = 0;
    for (dcr::tensor_id id = 0; id < registry.size(); ++id) {
      const auto& t = registry.at(id);
      dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        const auto* words = reinterpret_cast<const W*>(canonical.data());
        elements += applier.template dense_load<W>(id, dcr::tensor_view<const W>::contiguous(words, t.shape)).elements;
      });
    }
    return elements;
  }

  void build_items(std::mt19937_64& rng, double rate, const std::set<dcr::tensor_id>& overwrite_only,
                   std::vector<item>& out, std::uint64_t& records) {
    std::geometric_distribution<std::int64_t> gap(rate);  // uniform changes at `rate`
    for (dcr::tensor_id id = 0; id < registry.size(); ++id) {
      const auto& t = registry.at(id);
      item it;
      it.tensor = id;
      it.type = t.type;
      it.enc = overwrite_only.count(id) ? encoding::overwrite : encoding::xor_mask;
      for (std::int64_t i = gap(rng); i < t.numel(); i += 1 + gap(rng))
        it.indices.push_back(static_cast<std::uint64_t>(i));
      it.values.resize(it.indices.size() * dcr::dtype_size(t.type));
      for (auto& b : it.values) b = static_cast<std::byte>(rng() & 0x0f);  // small xor masks
      if (it.enc == encoding::xor_mask)
        for (std::size_t k = 0; k < it.values.size(); k += dcr::dtype_size(t.type))
          it.values[k] |= std::byte{1};  // every mask changes its element
      records += it.count();
      out.push_back(std::move(it));
    }
  }
};

bench_rank& rank() {
  static bench_rank r;
  return r;
}

void apply_items(benchmark::State& state, apply_path path) {
  auto& r = rank();
  const bool five = state.range(0) == 5;
  const auto& items = five ? r.items_5 : r.items_1;
  const std::uint64_t records = five ? r.records_5 : r.records_1;
  const std::uint64_t record_bytes = five ? r.record_bytes_5 : r.record_bytes_1;
  const std::uint64_t payload_bytes = five ? r.payload_bytes_5 : r.payload_bytes_1;
  std::uint64_t writes = 0;
  for (auto _ : state) {
    writes = r.applier.apply(items, apply_options{path, false}).writes;
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * record_bytes));
  state.counters["records"] = static_cast<double>(records);
  state.counters["writes"] = static_cast<double>(writes);
  state.counters["payload_bytes"] = benchmark::Counter(
      static_cast<double>(state.iterations() * payload_bytes), benchmark::Counter::kIsRate);
  state.SetLabel("items/s = records (changed elements) applied; bytes = record bytes");
}

// The baseline of the apply rates: a memcpy of the items' record bytes, in the same run.
void memcpy_records(benchmark::State& state) {
  auto& r = rank();
  const std::uint64_t bytes = state.range(0) == 5 ? r.record_bytes_5 : r.record_bytes_1;
  const std::uint64_t records = state.range(0) == 5 ? r.records_5 : r.records_1;
  std::vector<std::byte> from(bytes, std::byte{1}), to(bytes, std::byte{2});
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel("bytes = the record bytes of the same items");
}

// The floor of the compiled path's scattered writes (see the file comment); range(1) is the
// prefetch distance in writes, 0 for none.
void write_floor(benchmark::State& state) {
  auto& r = rank();
  const bool five = state.range(0) == 5;
  const auto& f = five ? r.floor_5 : r.floor_1;
  const auto ahead = static_cast<std::size_t>(state.range(1));
  const std::size_t n = f.at2.size();
  for (auto _ : state) {
    if (ahead == 0) {
      for (std::size_t i = 0; i < n; ++i) *f.at2[i] ^= f.value2[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        if (i + ahead < n) dcr::detail::prefetch_for_write(f.at2[i + ahead]);
        *f.at2[i] ^= f.value2[i];
      }
    }
    for (std::size_t i = 0; i < f.at_other.size(); ++i) *f.at_other[i] ^= f.value_other[i];
    benchmark::ClobberMemory();
  }
  const std::uint64_t records = five ? r.records_5 : r.records_1;
  const std::uint64_t record_bytes = five ? r.record_bytes_5 : r.record_bytes_1;
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * record_bytes));
  state.counters["writes"] = static_cast<double>(n + f.at_other.size());
  state.counters["lines"] = static_cast<double>(f.lines);
  state.SetLabel("the compiled path's writes alone; items/s and bytes as for the apply paths");
}

void compiled_path(benchmark::State& state) { apply_items(state, apply_path::compiled); }
void general_path(benchmark::State& state) { apply_items(state, apply_path::general); }

void dense_refit(benchmark::State& state) {
  auto& r = rank();
  std::uint64_t elements = 0;
  for (auto _ : state) {
    elements = r.dense_all();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2));
  state.counters["elements"] = static_cast<double>(elements);
  state.SetLabel("bytes = rank storage written");
}

// Prewarm compiles the placement (two loader calls per tensor) and allocates the scratch: the
// scratch's first touch is part of what a receiver pays once.
void prewarm(benchmark::State& state) {
  auto& r = rank();
  for (auto _ : state) r.applier.prewarm();
  std::uint64_t copies = 0;
  for (const auto& t : r.applier.plan().report()) copies += t.copies;
  state.counters["records"] = static_cast<double>(r.applier.plan().placements().size());
  state.counters["copies"] = static_cast<double>(copies);
}

}  // namespace

BENCHMARK(compiled_path)->Arg(1)->Arg(5)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(general_path)->Arg(1)->Arg(5)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(memcpy_records)->Arg(1)->Arg(5)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(write_floor)->Args({1, 0})->Args({1, 16})->Args({5, 0})->Args({5, 16})
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(dense_refit)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(prewarm)->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK_MAIN();
