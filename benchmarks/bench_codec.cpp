// Codec stages on one core, each beside the plain two-array compare loop over the same data in the
// same run. Stress protocol data (codec_workloads.hpp): 16 Mi BF16 elements (32 MiB per array) as
// one tensor, a share r of elements picked and multiplied by (1 + 0.01 z), r = 1%, 3%, 5% (the
// argument is r in per mille). Bytes processed = one BF16 array (the checkpoint), so every row's
// GB/s is comparable with the compare loop's. Buffers are built and touched before timing; the
// encoder, decoder and item vectors are reused across iterations, as in a warm refit.
//
// The whole diff and apply paths, stage breakdowns and the byte counts against the paper's coding
// are in codec_report; this program isolates one stage per benchmark.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "codec_workloads.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/choose.hpp"
#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"

namespace {

constexpr std::size_t elements = std::size_t{16} << 20;

struct data_set {
  std::vector<std::uint16_t> old_words, new_words;
  std::vector<std::uint64_t> changed;
  std::vector<std::uint16_t> old_gathered, new_gathered;
  dcr::tensor_registry registry{{{"layers.0000.weight", dcr::dtype::bf16,
                                  {static_cast<std::int64_t>(elements)}}}};
  dcr::payload_header header;
  dcr::encoding chosen = dcr::encoding::xor_mask;
  std::vector<dcr::item> items;  // one item, built by encode_gathered_item (the library path)
  std::vector<std::byte> payload;

  std::span<const std::uint16_t> old_g() const { return {old_gathered.data(), changed.size()}; }
  std::span<const std::uint16_t> new_g() const { return {new_gathered.data(), changed.size()}; }
};

const data_set& data_at(int permille) {
  static std::map<int, std::unique_ptr<data_set>> cache;
  auto& slot = cache[permille];
  if (!slot) {
    auto d = std::make_unique<data_set>();
    d->old_words.resize(elements);
    d->new_words.resize(elements);
    dcr::bench::fill_normal_bf16(d->old_words, 7);
    std::vector<std::uint64_t> chosen;
    dcr::bench::stress_update(d->old_words, permille / 1000.0, d->new_words, 8 + permille, chosen);
    dcr::detect_and_gather<std::uint16_t>(d->old_words, d->new_words, d->changed,
                                          d->old_gathered, d->new_gathered);
    d->header.registry_fingerprint = d->registry.fingerprint();
    dcr::item& it = d->items.emplace_back();
    it.tensor = 0;
    it.type = dcr::dtype::bf16;
    it.indices = d->changed;
    it.values.resize(d->changed.size() * 2);
    std::memcpy(it.values.data(), d->old_gathered.data(), it.values.size());
    d->chosen = dcr::encode_gathered_item<std::uint16_t>(it, d->new_g(),
                                                         dcr::encoding_policy::mixed, true);
    dcr::payload_encoder enc;
    enc.encode(d->header, d->items, d->registry, d->payload);
    slot = std::move(d);
  }
  return *slot;
}

void checkpoint_bytes(benchmark::State& state, const data_set& d) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2));
  state.counters["changed"] = static_cast<double>(d.changed.size());
}

// The baseline: count differing words.
[[gnu::noinline]] std::size_t compare_count(const std::uint16_t* a, const std::uint16_t* b,
                                            std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) d += a[i] != b[i];
  return d;
}

void compare_loop(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(compare_count(d.old_words.data(), d.new_words.data(), elements));
  checkpoint_bytes(state, d);
}

void detect(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  std::vector<std::uint64_t> changed(d.changed.size() * 2);
  for (auto _ : state) {
    changed.clear();
    dcr::detect_changes<std::uint16_t>(d.old_words, d.new_words, changed);
    benchmark::DoNotOptimize(changed.data());
  }
  checkpoint_bytes(state, d);
}

// detect_and_gather: detect plus the old and new words of each change, in one pass (the first
// step of the owner's and the differ's path; compare with detect).
void detect_and_gather(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  std::vector<std::uint64_t> changed;
  std::vector<std::uint16_t> o, w;
  changed.reserve(d.changed.size());
  o.reserve(d.changed.size());
  w.reserve(d.changed.size());
  for (auto _ : state) {
    changed.clear();
    o.clear();
    w.clear();
    dcr::detect_and_gather<std::uint16_t>(d.old_words, d.new_words, changed, o, w);
    benchmark::DoNotOptimize(changed.data());
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(w.data());
  }
  checkpoint_bytes(state, d);
}

void choose_encoding(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  for (auto _ : state)
    benchmark::DoNotOptimize(dcr::choose_encoding<std::uint16_t>(dcr::encoding_policy::mixed,
                                                                 true, d.old_g(), d.new_g()));
  checkpoint_bytes(state, d);
  state.SetLabel("chose encoding " + std::to_string(static_cast<int>(d.chosen)));
}

void make_item(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  const auto enc = static_cast<dcr::encoding>(state.range(1));
  dcr::item it;
  for (auto _ : state) {
    it = dcr::make_item<std::uint16_t>(0, dcr::dtype::bf16, enc, d.changed, d.old_g(), d.new_g());
    benchmark::DoNotOptimize(it.values.data());
  }
  checkpoint_bytes(state, d);
}

// encode_gathered_item: the encoding chosen and the values computed in place over the gathered
// old words, as the owner and the differ build each item (the old words are copied back into
// the item outside the timed region).
void gathered_item(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  dcr::item it = d.items[0];
  const std::size_t bytes = d.changed.size() * 2;
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(it.values.data(), d.old_gathered.data(), bytes);
    state.ResumeTiming();
    benchmark::DoNotOptimize(dcr::encode_gathered_item<std::uint16_t>(
        it, d.new_g(), dcr::encoding_policy::mixed, true));
    benchmark::DoNotOptimize(it.values.data());
  }
  if (it.values != d.items[0].values) state.SkipWithError("the item differs from the library's");
  checkpoint_bytes(state, d);
}

// payload_encoder::encode of the chosen item (locations, values, zstd), in a warm encoder.
void encode(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  dcr::payload_encoder enc;
  std::vector<std::byte> out;
  enc.encode(d.header, d.items, d.registry, out);
  for (auto _ : state) {
    enc.encode(d.header, d.items, d.registry, out);
    benchmark::DoNotOptimize(out.data());
  }
  checkpoint_bytes(state, d);
  state.counters["B/changed"] = static_cast<double>(out.size()) / d.changed.size();
}

void decode(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  dcr::payload_decoder dec;
  std::vector<dcr::item> items;
  dec.decode(d.payload, d.registry, items);
  for (auto _ : state) {
    dec.decode(d.payload, d.registry, items);
    benchmark::DoNotOptimize(items.data());
  }
  checkpoint_bytes(state, d);
}

// Writes the decoded item's new words into a resident copy (re-seeded from old every iteration
// outside the timed region, since xor and ulp are not idempotent).
void scatter(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  std::vector<std::uint16_t> resident = d.old_words;
  const dcr::item& it = d.items[0];
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(resident.data(), d.old_words.data(), elements * 2);
    state.ResumeTiming();
    const auto values = it.words<std::uint16_t>();
    std::uint16_t* dst = resident.data();
    dcr::visit_encoding(it.enc, [&](auto e) {
      using E = decltype(e);
      for (std::size_t j = 0; j < values.size(); ++j)
        dst[it.indices[j]] = E::apply(dst[it.indices[j]], values[j]);
    });
    benchmark::DoNotOptimize(dst);
  }
  if (resident != d.new_words) state.SkipWithError("scatter did not reproduce the new words");
  checkpoint_bytes(state, d);
}

template <class Baseline>
void baseline(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  Baseline b;
  b.prepare(elements, d.changed.size());
  std::size_t bytes = 0;
  for (auto _ : state) benchmark::DoNotOptimize(bytes = b.encode(d.old_words, d.new_words));
  checkpoint_bytes(state, d);
  state.counters["B/changed"] = static_cast<double>(bytes) / d.changed.size();
}

void rates(benchmark::internal::Benchmark* b) {
  for (int permille : {10, 30, 50}) b->Arg(permille);
}
void rates_and_encodings(benchmark::internal::Benchmark* b) {
  for (int permille : {10, 30, 50})
    for (auto e : {dcr::encoding::overwrite, dcr::encoding::xor_mask, dcr::encoding::ulp})
      b->Args({permille, static_cast<int>(e)});
}

}  // namespace

BENCHMARK(compare_loop)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(detect)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(detect_and_gather)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(choose_encoding)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(make_item)->Apply(rates_and_encodings)->Unit(benchmark::kMillisecond);
BENCHMARK(gathered_item)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(encode)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(decode)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK(scatter)->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(baseline, dcr::bench::paper_style)
    ->Name("paper_style_encode")->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(baseline, dcr::bench::sparse_int32)
    ->Name("sparse_int32_encode")->Apply(rates)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
