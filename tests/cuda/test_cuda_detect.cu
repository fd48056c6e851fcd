// tests/cuda/test_cuda_detect.cu: the device detect + project path (dcr::exec::detect_project on
// a cuda_policy) gives, record for record, what the CPU reference gives (the same dcr::bits_differ and mapping operator() in a host
// loop). A plain main(): exit 0 = pass, 1 = fail, 77 = skip (no CUDA device), which meson test
// reports as SKIP.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "dcr/detect/detect.hpp"
#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"
#include "dcr/mapping.hpp"
#include "../random_shard.hpp"
#include "cuda_test.hpp"

namespace {

using dcr_test::check;

template <class T>
struct device_buffer {
  T* p = nullptr;
  explicit device_buffer(std::size_t n) { DCR_CUDA_TRY(cudaMalloc(&p, (n ? n : 1) * sizeof(T))); }
  ~device_buffer() { (void)cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

/// Records the CPU path produces: the shared functor and mapping in a plain loop.
template <class W>
struct records {
  std::vector<std::uint64_t> index;
  std::vector<W> word;
  std::vector<std::uint32_t> part;
};

template <class W, class M>
records<W> cpu_reference(const std::vector<W>& tracker, const std::vector<W>& candidate,
                            const M& mapping) {
  records<W> r;
  for (std::size_t i = 0; i < tracker.size(); ++i) {
    if (!dcr::bits_differ{}(tracker[i], candidate[i])) continue;
    const dcr::mapped_index to = mapping(i);
    r.index.push_back(to.index);
    r.word.push_back(candidate[i]);
    r.part.push_back(to.part);
  }
  return r;
}

template <class W, class M>
void run_case(const char* name, std::size_t n, double rate, std::uint64_t seed, const M& mapping) {
  const std::string label = std::string(name) + " (n=" + std::to_string(n) +
                            ", W=u" + std::to_string(8 * sizeof(W)) + ")";
  std::vector<W> tracker, candidate;
  std::mt19937_64 rng(seed);
  dcr_test::make_shard(rng, n, rate, tracker, candidate);
  const auto expected = cpu_reference(tracker, candidate, mapping);

  device_buffer<W> d_tracker(n), d_candidate(n), d_new(n), d_old(n);
  device_buffer<std::uint64_t> d_index(n);
  device_buffer<std::uint32_t> d_part(n);
  cudaStream_t stream = nullptr;
  DCR_CUDA_TRY(cudaStreamCreate(&stream));
  const dcr::exec::cuda_policy policy{stream};
  DCR_CUDA_TRY(cudaMemcpy(d_tracker.p, tracker.data(), n * sizeof(W), cudaMemcpyHostToDevice));
  DCR_CUDA_TRY(cudaMemcpy(d_candidate.p, candidate.data(), n * sizeof(W), cudaMemcpyHostToDevice));

  // The workspace is sized once (two-phase), then reused by both forms.
  const std::size_t bytes = dcr::exec::detect_compact_workspace_bytes<W>(policy, n);
  device_buffer<unsigned char> workspace(bytes);
  const dcr::exec::workspace ws{workspace.p, bytes};
  const std::size_t count = dcr::exec::detect_project(
      policy, d_tracker.p, d_candidate.p, n, mapping,
      dcr::exec::changed_words<W>{d_index.p, nullptr, d_new.p}, d_part.p, ws);
  check(count == expected.index.size(),
        label + ": " + std::to_string(count) + " records, CPU reference has " +
            std::to_string(expected.index.size()));
  if (count == expected.index.size() && count > 0) {
    std::vector<std::uint64_t> index(count);
    std::vector<W> word(count);
    std::vector<std::uint32_t> part(count);
    DCR_CUDA_TRY(cudaMemcpy(index.data(), d_index.p, count * sizeof(std::uint64_t),
                            cudaMemcpyDeviceToHost));
    DCR_CUDA_TRY(cudaMemcpy(word.data(), d_new.p, count * sizeof(W), cudaMemcpyDeviceToHost));
    DCR_CUDA_TRY(cudaMemcpy(part.data(), d_part.p, count * sizeof(std::uint32_t),
                            cudaMemcpyDeviceToHost));
    check(index == expected.index, label + ": canonical indices differ from the CPU reference");
    check(word == expected.word, label + ": new words differ from the CPU reference");
    check(part == expected.part, label + ": parts differ from the CPU reference");
  }

  // The async form (old words too, no parts) gives the same count, read from the device slot.
  std::size_t* d_count = dcr::exec::detect_project_async(
      policy, d_tracker.p, d_candidate.p, n, mapping,
      dcr::exec::changed_words<W>{d_index.p, d_old.p, d_new.p},
      static_cast<std::uint32_t*>(nullptr), ws);
  check(dcr::exec::wait_count(policy, d_count) == expected.index.size(),
        label + ": async form counts differently");

  // A word count that is not the mapping's local size is refused before any work.
  if (n > 0) {
    bool refused = false;
    try {
      (void)dcr::exec::detect_project(policy, d_tracker.p, d_candidate.p, n - 1, mapping,
                                      dcr::exec::changed_words<W>{d_index.p, nullptr, d_new.p},
                                      nullptr, ws);
    } catch (const dcr::error& e) {
      refused = e.code() == dcr::errc::shape_mismatch;
    }
    check(refused, label + ": a wrong word count was not refused as shape_mismatch");
  }
  DCR_CUDA_TRY(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
  return dcr_test::run_cuda_test("cuda detect: all cases match the CPU reference", [] {
    const std::int64_t shape2[] = {1537, 2049};  // odd extents: uneven splits, ragged tiles
    const auto n2 = static_cast<std::size_t>(shape2[0] * shape2[1]);
    run_case<std::uint16_t>("replicated", n2, 0.03, 1, dcr::replicated(n2));
    run_case<std::uint16_t>("column_split 1/3", dcr::column_split(shape2, 3, 1).local_size(),
                            0.01, 2, dcr::column_split(shape2, 3, 1));
    run_case<std::uint32_t>("row_split 2/4", dcr::row_split(shape2, 4, 2).local_size(), 0.01, 3,
                            dcr::row_split(shape2, 4, 2));
    run_case<std::uint32_t>("column_split all changed", dcr::column_split(shape2, 2, 0).local_size(),
                            1.0, 4, dcr::column_split(shape2, 2, 0));
    run_case<std::uint16_t>("row_split none changed", dcr::row_split(shape2, 2, 1).local_size(),
                            0.0, 5, dcr::row_split(shape2, 2, 1));
    // Stacked experts [4, 96, 130], each expert's slice a column split of its [96, 260] tensor.
    const std::int64_t expert_shape[] = {96, 260};
    const dcr::stacked experts(4, dcr::column_split(expert_shape, 2, 1).to_box(expert_shape));
    run_case<std::uint16_t>("stacked x column_split", experts.local_size(), 0.05, 6, experts);
    // A permuted box: local [cols, rows] of a [rows, cols] block (output follows local order).
    const std::int64_t off[] = {100, 7}, ext[] = {300, 500};
    const int axes[] = {1, 0};
    const dcr::box transposed(shape2, off, ext, axes);
    run_case<std::uint32_t>("permuted box", transposed.local_size(), 0.02, 7, transposed);
    run_case<std::uint16_t>("empty", 0, 0.5, 8, dcr::replicated(0));
  });
}
