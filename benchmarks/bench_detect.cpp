// Change detection on one core, beside a plain two-array compare loop over the same data in the
// same run (the memory-bandwidth baseline). BF16 words, 64 Mi elements (128 MiB per array),
// change rates 0%, 1%, 3%, 100%. Buffers are allocated and touched before timing.
// exec_detect_compact: the same through dcr::exec::detect_compact on the CPU policy (indices
// plus old and new words into preallocated arrays), on one thread and on two.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dcr/detect/detect.hpp"
#include "dcr/exec/algorithms.hpp"
#include "dcr/sim/random.hpp"

namespace {

constexpr std::size_t elements = std::size_t{64} << 20;

struct data_set {
  std::vector<std::uint16_t> tracker, candidate;
  std::vector<std::uint64_t> changed;
  std::vector<std::uint64_t> index;                  // exec outputs (capacity: every element)
  std::vector<std::uint16_t> old_words, new_words;
};

const data_set& data_at(int permille) {
  static std::vector<std::unique_ptr<data_set>> cache(1001);
  auto& slot = cache[static_cast<std::size_t>(permille)];
  if (!slot) {
    slot = std::make_unique<data_set>();
    dcr::sim::rng g(42);
    slot->tracker.resize(elements);
    for (auto& w : slot->tracker) w = static_cast<std::uint16_t>(g.next());
    slot->candidate = slot->tracker;
    const double rate = permille / 1000.0;
    for (auto& w : slot->candidate)
      if (g.uniform() < rate) w ^= 1;
    slot->changed.reserve(elements);
  }
  return *slot;
}

/// data_at with the exec outputs allocated and touched (outside any timing).
data_set& data_with_outputs(int permille) {
  auto& d = const_cast<data_set&>(data_at(permille));
  if (d.old_words.empty()) {
    d.index.assign(elements, 0);
    d.old_words.assign(elements, 0);
    d.new_words.assign(elements, 0);
  }
  return d;
}


// The baseline: count differing words (no index output), which compilers vectorize fully.
void plain_compare(benchmark::State& state) {
  const auto& d = data_at(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    std::size_t diff = 0;
    for (std::size_t i = 0; i < elements; ++i) diff += d.tracker[i] != d.candidate[i];
    benchmark::DoNotOptimize(diff);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2));
  state.SetLabel("bytes = one BF16 source array");
}

void detect(benchmark::State& state) {
  auto& d = const_cast<data_set&>(data_at(static_cast<int>(state.range(0))));
  for (auto _ : state) {
    d.changed.clear();
    dcr::detect_changes<std::uint16_t>(d.tracker, d.candidate, d.changed);
    benchmark::DoNotOptimize(d.changed.data());
  }
  state.counters["changed"] = static_cast<double>(d.changed.size());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2));
}

void exec_detect_compact(benchmark::State& state) {
  auto& d = data_with_outputs(static_cast<int>(state.range(0)));
  const auto policy = dcr::exec::cpu.on(static_cast<unsigned>(state.range(1)));
  std::size_t count = 0;
  for (auto _ : state) {
    count = dcr::exec::detect_compact(
        policy, d.tracker.data(), d.candidate.data(), elements,
        dcr::exec::changed_words<std::uint16_t>{d.index.data(), d.old_words.data(),
                                                d.new_words.data()});
    benchmark::DoNotOptimize(d.index.data());
  }
  state.counters["changed"] = static_cast<double>(count);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 2));
  state.SetLabel("indices + old + new words, preallocated outputs");
}

}  // namespace

BENCHMARK(plain_compare)->Arg(0)->Arg(10)->Arg(30)->Arg(1000)->Unit(benchmark::kMillisecond);
BENCHMARK(detect)->Arg(0)->Arg(10)->Arg(30)->Arg(1000)->Unit(benchmark::kMillisecond);
BENCHMARK(exec_detect_compact)
    ->ArgsProduct({{0, 10, 30, 1000}, {1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(exec_detect_compact)  // wall time: the main thread's CPU time is half the work
    ->ArgsProduct({{0, 10, 30, 1000}, {2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
