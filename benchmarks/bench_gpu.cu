// GPU benchmarks of the CUDA exec backend (nvcc only; run by scripts/gpu-check). Every figure
// is timed with CUDA events (manual time) and set beside its baseline in the same run:
//   * detect + compact (dcr::exec::detect_compact_async, device tracker) at 0.1%, 1%, 3% and 5%
//     of BF16 words changed, against a device-to-device copy of the same bytes (the copy reads
//     one array and writes one, detect reads two: both move 2 x shard bytes through HBM;
//     bytes_per_second counts those 2 x shard bytes for both, so the ratio is the fraction of
//     the copy's bandwidth detect reaches; target >= 0.8);
//   * detect + compact with the tracker in pinned host memory (pinned_tracker_pipeline), against
//     a host-to-device copy of the tracker bytes (bytes_per_second = tracker bytes crossing
//     PCIe for both; target >= 0.8);
//   * the per-record apply (dcr::exec::apply_item_records_async, xor, through a contiguous and
//     a transposed placement record) against a plain scatter kernel out[index[k]] = value[k]
//     (items_per_second = changed elements).
// Sizes: DCR_GPU_BENCH_ELEMENTS (default 512 Mi BF16 words = 1 GiB per array). Buffers are
// allocated and touched before timing.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcr/exec/algorithms.hpp"
#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"

namespace {

namespace ex = dcr::exec;
using word = std::uint16_t;

std::size_t elements() {
  static const std::size_t n = [] {
    const char* s = std::getenv("DCR_GPU_BENCH_ELEMENTS");
    return s != nullptr ? static_cast<std::size_t>(std::strtoull(s, nullptr, 10))
                        : std::size_t{512} << 20;
  }();
  return n;
}

/// Times `body` (enqueued on `stream`) with CUDA events, one iteration per benchmark step.
template <class Body>
void time_loop(benchmark::State& state, cudaStream_t stream, Body&& body) {
  cudaEvent_t start = nullptr, stop = nullptr;
  DCR_CUDA_TRY(cudaEventCreate(&start));
  DCR_CUDA_TRY(cudaEventCreate(&stop));
  body();  // warm: first launch, page mapping
  DCR_CUDA_TRY(cudaStreamSynchronize(stream));
  for (auto _ : state) {
    DCR_CUDA_TRY(cudaEventRecord(start, stream));
    body();
    DCR_CUDA_TRY(cudaEventRecord(stop, stream));
    DCR_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    DCR_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  DCR_CUDA_TRY(cudaEventDestroy(start));
  DCR_CUDA_TRY(cudaEventDestroy(stop));
}

/// One shard on the device (tracker, candidates at each rate, outputs) and a pinned tracker.
struct gpu_data {
  cudaStream_t stream = nullptr;
  ex::cuda_policy policy;
  std::size_t n = elements();
  word* tracker = nullptr;
  word* pinned_tracker = nullptr;
  word* scratch = nullptr;  // copy destination
  std::vector<word*> candidate;  // by rate index
  std::uint64_t* index = nullptr;
  word* old_words = nullptr;
  word* new_words = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  std::unique_ptr<ex::pinned_tracker_pipeline> pipe;
  void* pipe_ws = nullptr;
  std::size_t pipe_ws_bytes = 0;
  std::vector<std::size_t> changed;  // by rate index

  static constexpr int permille_x10[] = {1, 10, 30, 50};  // 0.1%, 1%, 3%, 5%

  gpu_data() {
    DCR_CUDA_TRY(cudaStreamCreate(&stream));
    policy = ex::cuda_policy{}.on(stream);
    std::mt19937_64 rng(42);
    std::vector<word> host(n);
    for (auto& w : host) w = static_cast<word>(rng());
    DCR_CUDA_TRY(cudaMalloc(&tracker, n * sizeof(word)));
    DCR_CUDA_TRY(cudaMalloc(&scratch, n * sizeof(word)));
    DCR_CUDA_TRY(cudaMallocHost(&pinned_tracker, n * sizeof(word)));
    std::copy(host.begin(), host.end(), pinned_tracker);
    DCR_CUDA_TRY(cudaMemcpy(tracker, host.data(), n * sizeof(word), cudaMemcpyHostToDevice));
    DCR_CUDA_TRY(cudaMemset(scratch, 0, n * sizeof(word)));
    for (int r : permille_x10) {
      std::vector<word> cand = host;
      std::bernoulli_distribution change(r / 1000.0);
      for (auto& w : cand)
        if (change(rng)) w ^= 1;
      word* d = nullptr;
      DCR_CUDA_TRY(cudaMalloc(&d, n * sizeof(word)));
      DCR_CUDA_TRY(cudaMemcpy(d, cand.data(), n * sizeof(word), cudaMemcpyHostToDevice));
      candidate.push_back(d);
    }
    const std::size_t cap = n / 10 + 1;  // outputs sized for up to 10% changed
    DCR_CUDA_TRY(cudaMalloc(&index, cap * sizeof(std::uint64_t)));
    DCR_CUDA_TRY(cudaMalloc(&old_words, cap * sizeof(word)));
    DCR_CUDA_TRY(cudaMalloc(&new_words, cap * sizeof(word)));
    DCR_CUDA_TRY(cudaMemset(index, 0, cap * sizeof(std::uint64_t)));
    ws_bytes = ex::detect_compact_workspace_bytes<word>(policy, n);
    DCR_CUDA_TRY(cudaMalloc(&ws, ws_bytes));
    pipe = std::make_unique<ex::pinned_tracker_pipeline>(std::size_t{1} << 25);
    pipe_ws_bytes = pipe->workspace_bytes<word>(policy, n);
    DCR_CUDA_TRY(cudaMalloc(&pipe_ws, pipe_ws_bytes));
    for (word* c : candidate) changed.push_back(detect(c));
  }

  std::size_t detect(const word* c) {
    return ex::detect_compact(policy, tracker, c, n,
                              ex::changed_words<word>{index, old_words, new_words},
                              ex::workspace{ws, ws_bytes});
  }
};

gpu_data& data() {
  static gpu_data d;
  return d;
}

/// The baselines: a device-to-device copy of the tracker (bytes = read + written, 2 x shard) and
/// a host-to-device copy of the pinned tracker (bytes = tracker over PCIe).
void copy(benchmark::State& state, bool from_host) {
  auto& d = data();
  time_loop(state, d.stream, [&] {
    DCR_CUDA_TRY(cudaMemcpyAsync(d.scratch, from_host ? d.pinned_tracker : d.tracker,
                                 d.n * sizeof(word),
                                 from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                                 d.stream));
  });
  const std::size_t bytes = (from_host ? 1 : 2) * d.n * sizeof(word);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(from_host ? "bytes = pinned tracker over PCIe" : "bytes = read + written (2 x shard)");
}

void d2d_copy(benchmark::State& state) { copy(state, false); }
void h2d_copy(benchmark::State& state) { copy(state, true); }

/// detect + compact at rate index state.range(0): the tracker in device memory (bytes = tracker
/// + candidate read, against d2d_copy) or in pinned host memory streamed in chunks (bytes =
/// tracker over PCIe, against h2d_copy).
void detect(benchmark::State& state, bool pinned) {
  auto& d = data();
  const auto r = static_cast<std::size_t>(state.range(0));
  const ex::changed_words<word> out{d.index, d.old_words, d.new_words};
  time_loop(state, d.stream, [&] {
    if (pinned)
      d.pipe->detect_compact_async(d.policy, d.pinned_tracker, d.candidate[r], d.n, out,
                                   ex::workspace{d.pipe_ws, d.pipe_ws_bytes});
    else
      ex::detect_compact_async(d.policy, d.tracker, d.candidate[r], d.n, out,
                               ex::workspace{d.ws, d.ws_bytes});
  });
  const std::size_t bytes = (pinned ? 1 : 2) * d.n * sizeof(word);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["changed"] = static_cast<double>(d.changed[r]);
  state.counters["rate_pct"] = gpu_data::permille_x10[r] / 10.0;
  state.SetLabel(pinned ? "bytes = pinned tracker over PCIe"
                        : "bytes = tracker + candidate read (2 x shard)");
}

void detect_device(benchmark::State& state) { detect(state, false); }
void detect_pinned(benchmark::State& state) { detect(state, true); }

__global__ void scatter_kernel(word* __restrict__ out, const std::uint64_t* __restrict__ index,
                               const word* __restrict__ values, std::size_t m) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < m;
       k += stride)
    out[index[k]] = values[k];
}

/// Placement records over `scratch` ([0] contiguous, [1] the shard as a [rows, 4096] tensor
/// stored transposed) and the apply's write counter. Items: the compacted indices of one rate
/// (d.index, sorted) with the new words as xor masks (the time does not depend on the values).
struct apply_data {
  dcr::placement* records = nullptr;
  void* counter = nullptr;
};

apply_data& apply_set() {
  static std::unique_ptr<apply_data> set;
  auto& d = data();
  if (!set) {
    set = std::make_unique<apply_data>();
    auto& a = *set;
    const std::int64_t cols = 4096;
    const std::int64_t rows = static_cast<std::int64_t>(d.n) / cols;
    dcr::placement host[2];
    host[0] = dcr::placement::contiguous(reinterpret_cast<std::byte*>(d.scratch),
                                         static_cast<std::int64_t>(d.n), sizeof(word));
    const std::int64_t stride[] = {cols, 1}, extent[] = {rows, cols}, step[] = {1, rows};
    host[1] = dcr::placement::of(dcr::view_inverse::strided(stride, extent, step), 0,
                                 reinterpret_cast<std::byte*>(d.scratch), sizeof(word));
    DCR_CUDA_TRY(cudaMalloc(&a.records, sizeof host));
    DCR_CUDA_TRY(cudaMemcpy(a.records, host, sizeof host, cudaMemcpyHostToDevice));
    DCR_CUDA_TRY(cudaMalloc(&a.counter, ex::apply_workspace_bytes(d.policy)));
  }
  return *set;
}

void apply_records(benchmark::State& state) {
  auto& d = data();
  const auto r = static_cast<std::size_t>(state.range(0));
  const auto which = static_cast<std::size_t>(state.range(1));
  auto& a = apply_set();
  const std::size_t m = d.detect(d.candidate[r]);  // d.index: this rate's changed indices
  time_loop(state, d.stream, [&] {
    ex::apply_item_records_async<word>(d.policy, a.records + which, 1, dcr::encoding::xor_mask,
                                       d.index, m, d.new_words,
                                       ex::workspace{a.counter, ex::apply_workspace_bytes(d.policy)});
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * m));
  state.counters["rate_pct"] = gpu_data::permille_x10[r] / 10.0;
  state.SetLabel(which == 0 ? "contiguous record, items = changed elements"
                            : "transposed record, items = changed elements");
}

void plain_scatter(benchmark::State& state) {
  auto& d = data();
  const auto r = static_cast<std::size_t>(state.range(0));
  const std::size_t m = d.detect(d.candidate[r]);
  time_loop(state, d.stream, [&] {
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>((m + 255) / 256 + 1, 4096));
    scatter_kernel<<<blocks, 256, 0, d.stream>>>(d.scratch, d.index, d.new_words, m);
    DCR_CUDA_TRY(cudaGetLastError());
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * m));
  state.counters["rate_pct"] = gpu_data::permille_x10[r] / 10.0;
  state.SetLabel("baseline: out[index[k]] = value[k]");
}

}  // namespace

BENCHMARK(d2d_copy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(detect_device)->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(h2d_copy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(detect_pinned)->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(plain_scatter)->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(apply_records)->ArgsProduct({{0, 1, 2, 3}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_gpu: no CUDA device\n");
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
