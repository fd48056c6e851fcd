// dcr/kernels/detect.cuh: detect and project on a CUDA device (nvcc only).
//
// The device twin of dcr::detect_changes followed by projection through a mapping class: compare
// the tracker's words with the candidate's (dcr::bits_differ, the same functor the CPU path
// uses), compact the changed local indices in increasing order with CUB, then project each one
// to its canonical flat index through the mapping (the same DCR_HOST_DEVICE operator() the CPU
// path calls) and gather its new word. The result is, record for record, what the CPU reference
// loop produces: tests/cuda/test_cuda_detect.cu checks exactly that.
//
// Two entry points, zstd-style:
//   * detect_workspace_bytes + detect_and_project_async: caller-owned workspace, nothing
//     allocated, nothing synchronized; the record count lands in device memory.
//   * detect_and_project: convenience; allocates the workspace stream-ordered, waits for the
//     stream and returns the record count.
#pragma once

#if !defined(__CUDACC__)
#error "dcr/kernels/detect.cuh is CUDA code: compile it with nvcc"
#endif
// The device functors call constexpr standard functions (std::bit_width, std::array's
// operator[]) that nvcc treats as host-only without this flag.
#if !defined(__CUDACC_RELAXED_CONSTEXPR__)
// (`pkg-config --cflags dcr-kernels` and CMake's dcr::kernels carry it.)
#error "dcr/kernels/detect.cuh needs nvcc --expt-relaxed-constexpr"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_select.cuh>

#include "dcr/detect/detect.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/exec/functors.hpp"
#include "dcr/kernels/exec.cuh"
#include "dcr/kernels/cuda_check.cuh"
#include "dcr/mapping/concept.hpp"

namespace dcr::kernels {

namespace detail {

using local_index_iterator = ::dcr::exec::detail::global_index_iterator;

inline constexpr int project_block = 256;
inline constexpr std::size_t project_max_blocks = 4096;  // grid-stride beyond; fills an H200
inline constexpr std::size_t workspace_align = 256;

constexpr std::size_t align_up(std::size_t x) noexcept {
  return (x + workspace_align - 1) / workspace_align * workspace_align;
}

/// In place over the compacted local indices: index[k] <- mapping(index[k]).index, and the new
/// word (and the target part, when asked for) of that element. The count is read on the device,
/// so no host round trip separates compaction from projection.
template <storage_word W, index_mapping M>
__global__ void __launch_bounds__(project_block)
    project_changed(const W* __restrict__ candidate, std::uint64_t* __restrict__ index,
                    W* __restrict__ out_new, std::uint32_t* __restrict__ out_part,
                    const std::size_t* __restrict__ count, M mapping) {
  const std::size_t m = *count;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < m;
       k += stride) {
    const std::uint64_t local = index[k];
    const mapped_index to = mapping(local);
    index[k] = to.index;
    out_new[k] = candidate[local];
    if (out_part != nullptr) out_part[k] = to.part;
  }
}

}  // namespace detail

/// Device workspace, in bytes, that detect_and_project_async needs for `n` words of type W.
/// Depends only on W and n: size it once per shard and reuse it every step.
template <storage_word W>
std::size_t detect_workspace_bytes(std::size_t n, cudaStream_t stream = nullptr) {
  return ::dcr::exec::detail::select_temp_bytes<W>(n, stream);
}

/// Enqueues detect + project on `stream`; allocates nothing and does not synchronize.
///
/// Inputs (device memory): `tracker` and `candidate`, `n` words each, the whole source shard
/// described by `mapping` (n == mapping.local_size()). Outputs (device memory, capacity n each,
/// the worst case): for the k-th changed element in increasing local-index order,
/// `out_index[k]` = mapping(local).index, `out_new[k]` = candidate[local], and, when `out_part`
/// is not null, `out_part[k]` = mapping(local).part (needed for multi-part mappings such as
/// `stacked`). The output is in increasing canonical order for every mapping that preserves
/// order (replicated, row_split, column_split, an unpermuted box; stacked: by part, then index).
/// `*d_count` (device memory) receives the number of records once the stream reaches it.
/// `workspace` (device memory) holds at least detect_workspace_bytes<W>(n) bytes.
///
/// Throws dcr::error(shape_mismatch) if n differs from the mapping's local size,
/// dcr::error(invalid_argument) for a missing or too small workspace, and dcr::error(device_error)
/// for a CUDA failure.
template <storage_word W, index_mapping M>
void detect_and_project_async(const W* tracker, const W* candidate, std::size_t n, M mapping,
                              std::uint64_t* out_index, W* out_new, std::uint32_t* out_part,
                              std::size_t* d_count, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream) {
  DCR_EXPECTS(n == mapping.local_size(), errc::shape_mismatch,
              "detect_and_project: word count differs from the mapping's local size");
  DCR_EXPECTS(d_count != nullptr, errc::invalid_argument, "detect_and_project: no count slot");
  if (n == 0) {
    DCR_CUDA_TRY(cudaMemsetAsync(d_count, 0, sizeof(std::size_t), stream));
    return;
  }
  std::size_t temp_bytes = workspace_bytes;
  DCR_EXPECTS(workspace != nullptr && temp_bytes >= ::dcr::exec::detail::select_temp_bytes<W>(n, stream),
              errc::invalid_argument,
              "detect_and_project: workspace smaller than detect_workspace_bytes()");
  DCR_CUDA_TRY(cub::DeviceSelect::If(workspace, temp_bytes, detail::local_index_iterator{0},
                                     out_index, d_count, static_cast<std::int64_t>(n),
                                     ::dcr::exec::fn::changed_from<W>{{tracker, candidate}, 0},
                                     stream));
  const std::size_t wanted = (n + detail::project_block - 1) / detail::project_block;
  const auto blocks =
      static_cast<unsigned>(wanted < detail::project_max_blocks ? wanted
                                                                : detail::project_max_blocks);
  detail::project_changed<W, M><<<blocks, detail::project_block, 0, stream>>>(
      candidate, out_index, out_new, out_part, d_count, mapping);
  DCR_CUDA_TRY(cudaGetLastError());
}

/// Detect + project, as detect_and_project_async, with a stream-ordered workspace allocated and
/// freed here; waits for `stream` and returns the number of records written. Convenient for
/// tests and one-off calls; a refit loop sizes a workspace once and calls the async form.
template <storage_word W, index_mapping M>
std::size_t detect_and_project(const W* tracker, const W* candidate, std::size_t n, M mapping,
                               std::uint64_t* out_index, W* out_new, cudaStream_t stream,
                               std::uint32_t* out_part = nullptr) {
  DCR_EXPECTS(n == mapping.local_size(), errc::shape_mismatch,
              "detect_and_project: word count differs from the mapping's local size");
  if (n == 0) return 0;
  // One allocation: the count slot, then CUB's temporary storage.
  const std::size_t head = detail::align_up(sizeof(std::size_t));
  const std::size_t temp_bytes = detect_workspace_bytes<W>(n, stream);
  void* block = nullptr;
  DCR_CUDA_TRY(cudaMallocAsync(&block, head + temp_bytes, stream));
  struct release {
    void* p;
    cudaStream_t s;
    ~release() { (void)cudaFreeAsync(p, s); }
  } guard{block, stream};
  auto* d_count = static_cast<std::size_t*>(block);
  detect_and_project_async(tracker, candidate, n, mapping, out_index, out_new, out_part, d_count,
                           static_cast<unsigned char*>(block) + head, temp_bytes, stream);
  std::size_t count = 0;
  DCR_CUDA_TRY(cudaMemcpyAsync(&count, d_count, sizeof count, cudaMemcpyDeviceToHost, stream));
  DCR_CUDA_TRY(cudaStreamSynchronize(stream));
  return count;
}

}  // namespace dcr::kernels
