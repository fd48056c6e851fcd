// dcr/kernels/exec.cuh: the CUDA backend of the exec algorithms (nvcc only).
//
// dcr::exec::cuda_policy is a CUDA stream plus a device memory resource. The algorithms of
// dcr/exec/algorithms.hpp run on it with the same per-index functors (dcr/exec/functors.hpp) as
// the CPU and Thrust backends; this header adds the loop primitive (a grid-stride kernel), the
// compaction (CUB DeviceSelect: one pass with decoupled look-back), detect + project (the
// compaction, then the mapping applied in place over the device count), the per-record apply kernel
// and the pinned-host-tracker pipeline. All pointers are device pointers (or, where said,
// pinned host memory, reached through unified virtual addressing).
//
// Two-phase, zstd/CUB style: *_workspace_bytes(policy, n) first, then the step with a
// caller-owned device workspace. `*_async` forms enqueue on policy.stream, allocate nothing and
// do not synchronize (counts land in device memory); the plain forms also copy the count back
// and wait for the stream. Launch and runtime errors throw dcr::error(errc::device_error)
// through DCR_CUDA_TRY; device code never throws (preconditions as in algorithms.hpp).
//
// Tracker placement, the trade (see docs/gpu.md):
//   * device tracker (detect_compact): tracker and candidate both in HBM; one read of each per
//     step. Device memory: n words of tracker, plus outputs (worst case n * (8 + 2 sizeof(W))
//     bytes; size them for the expected change rate with headroom if memory is tight) and
//     detect_compact_workspace_bytes.
//   * pinned host tracker (pinned_tracker_pipeline): the tracker stays in host memory (as the
//     paper keeps baselines) and streams to the device in chunks over PCIe, double-buffered on
//     a copy stream so the H2D copy of chunk c+1 overlaps the compare of chunk c. Device memory:
//     2 chunks of tracker words + one chunk of indices + CUB scratch (workspace_bytes), instead
//     of n tracker words; bound by the H2D rate (one tracker read per step crosses PCIe).
//   * update_tracker after commit writes new words at the changed indices: into device memory,
//     or straight into pinned host memory from the kernel (small scattered PCIe writes; at a 1%
//     change rate this is 1% of the tracker's bytes).
#pragma once

#if !defined(__CUDACC__)
#error "dcr/kernels/exec.cuh is CUDA code: compile it with nvcc"
#endif
// The device functors call constexpr standard functions (std::bit_width, std::array's
// operator[]) that nvcc treats as host-only without this flag.
#if !defined(__CUDACC_RELAXED_CONSTEXPR__)
// (`pkg-config --cflags dcr-kernels` and CMake's dcr::kernels carry it.)
#error "dcr/kernels/exec.cuh needs nvcc --expt-relaxed-constexpr"
#endif

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "dcr/exec/algorithms.hpp"
#include "dcr/exec/functors.hpp"
#include "dcr/exec/policy.hpp"
#include "dcr/kernels/cuda_check.cuh"

namespace dcr::exec {

/// Where the CUDA backend's owning helpers (device_buffer) get device memory: stream-ordered
/// allocation. Algorithms never allocate; setup code sizes workspaces and buffers once.
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept = 0;
};

/// cudaMallocAsync / cudaFreeAsync on the device's default memory pool.
class async_memory_resource final : public device_memory_resource {
 public:
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    DCR_CUDA_TRY(cudaMallocAsync(&p, bytes != 0 ? bytes : 1, stream));
    return p;
  }
  void deallocate(void* p, std::size_t, cudaStream_t stream) noexcept override {
    (void)cudaFreeAsync(p, stream);
  }
};

/// The process-wide default resource.
inline device_memory_resource& default_device_resource() {
  static async_memory_resource resource;
  return resource;
}

/// The CUDA backend: work is enqueued on `stream`; owning helpers allocate from `resource`.
struct cuda_policy {
  using policy_concept = policy_tag;
  cudaStream_t stream = nullptr;
  device_memory_resource* resource = &default_device_resource();

  /// The same policy on another stream.
  [[nodiscard]] cuda_policy on(cudaStream_t s) const noexcept {
    cuda_policy p = *this;
    p.stream = s;
    return p;
  }
};

static_assert(execution_policy<cuda_policy>);

/// A device allocation of `count` T from a policy's resource, freed stream-ordered.
template <class T>
class device_buffer {
 public:
  device_buffer(const cuda_policy& policy, std::size_t count)
      : policy_(policy),
        bytes_(count * sizeof(T)),
        data_(static_cast<T*>(policy.resource->allocate(bytes_, policy.stream))) {}
  ~device_buffer() { policy_.resource->deallocate(data_, bytes_, policy_.stream); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] workspace as_workspace() const noexcept { return {data_, bytes_}; }

 private:
  cuda_policy policy_;
  std::size_t bytes_;
  T* data_;
};

namespace detail {

inline constexpr int cuda_block = 256;
inline constexpr std::size_t cuda_max_blocks = 4096;  // grid-stride beyond; fills an H200
inline constexpr std::size_t workspace_align = 256;

constexpr std::size_t align_up(std::size_t x) noexcept {
  return (x + workspace_align - 1) / workspace_align * workspace_align;
}

inline unsigned blocks_for(std::size_t m) noexcept {
  const std::size_t wanted = (m + cuda_block - 1) / cuda_block;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, cuda_max_blocks));
}

template <class Op>
__global__ void __launch_bounds__(cuda_block) for_each_kernel(std::size_t m, Op op) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < m;
       k += stride)
    op(k);
}

/// for_each over a count that lives in device memory (after a compaction).
template <class Op>
__global__ void __launch_bounds__(cuda_block)
    for_each_counted_kernel(const std::size_t* __restrict__ count, Op op) {
  const std::size_t m = *count;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < m;
       k += stride)
    op(k);
}

using global_index_iterator = thrust::counting_iterator<std::uint64_t>;

template <storage_word W>
std::size_t select_temp_bytes(std::size_t n, cudaStream_t stream) {
  std::size_t bytes = 0;
  DCR_CUDA_TRY(cub::DeviceSelect::If(nullptr, bytes, global_index_iterator{0},
                                     static_cast<std::uint64_t*>(nullptr),
                                     static_cast<std::size_t*>(nullptr),
                                     static_cast<std::int64_t>(n), fn::changed_from<W>{}, stream));
  return bytes;
}

}  // namespace detail

// ---- memory of the policy's space (what code written once over the policy uses) ----------------

/// `count` T of device memory from the policy's resource (dcr/exec/algorithms.hpp: make_buffer).
template <class T>
device_buffer<T> make_buffer(const cuda_policy& policy, std::size_t count) {
  return device_buffer<T>(policy, count);
}

/// Enqueues dst (device) <- src (host), `count` T, on policy.stream. src must stay unchanged
/// until the next download or synchronize on the policy (from pageable memory the runtime has
/// staged it when this returns; from pinned memory the copy is truly asynchronous).
template <class T>
void upload(const cuda_policy& policy, T* dst, const T* src, std::size_t count) {
  if (count != 0)
    DCR_CUDA_TRY(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice,
                                 policy.stream));
}

/// dst (host) <- src (device), `count` T, after everything enqueued on policy.stream; waits.
template <class T>
void download(const cuda_policy& policy, T* dst, const T* src, std::size_t count) {
  if (count != 0)
    DCR_CUDA_TRY(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost,
                                 policy.stream));
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
}

/// Waits for everything enqueued on policy.stream.
inline void synchronize(const cuda_policy& policy) {
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
}

/// The count an `*_async` step left in device memory at `d_count`: copies it back and waits for
/// policy.stream.
inline std::size_t wait_count(const cuda_policy& policy, const std::size_t* d_count) {
  std::size_t count = 0;
  DCR_CUDA_TRY(cudaMemcpyAsync(&count, d_count, sizeof count, cudaMemcpyDeviceToHost,
                               policy.stream));
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  return count;
}

// ---- loop primitive ----------------------------------------------------------------------------

/// Enqueues op(k) for k in [0, m) as a grid-stride kernel on policy.stream.
template <class Op>
void for_each_index(const cuda_policy& policy, std::size_t m, Op op) {
  if (m == 0) return;
  detail::for_each_kernel<Op><<<detail::blocks_for(m), detail::cuda_block, 0, policy.stream>>>(m, op);
  DCR_CUDA_TRY(cudaGetLastError());
}

// ---- detect + compact, device tracker ----------------------------------------------------------

/// Device workspace of detect_compact for n words: a count slot and CUB's scratch.
template <storage_word W>
std::size_t detect_compact_workspace_bytes(const cuda_policy& policy, std::size_t n) {
  return detail::align_up(sizeof(std::size_t)) +
         (n != 0 ? detail::select_temp_bytes<W>(n, policy.stream) : 0);
}

/// Enqueues detect + compact: CUB select of the changed global indices (first_index + local, in
/// increasing order) into out.index, then the gather of their old and new words; the count
/// lands in the workspace's count slot, whose address is returned (device memory, valid once
/// the stream reaches it). Allocates nothing, does not synchronize. Throws invalid_argument for
/// a workspace smaller than detect_compact_workspace_bytes<W>(policy, n).
template <storage_word W>
std::size_t* detect_compact_async(const cuda_policy& policy, const W* tracker, const W* candidate,
                                  std::size_t n, changed_words<W> out, workspace ws,
                                  std::uint64_t first_index = 0) {
  const std::size_t need = detect_compact_workspace_bytes<W>(policy, n);
  DCR_EXPECTS(ws.data != nullptr && ws.bytes >= need, errc::invalid_argument,
              "dcr::exec::detect_compact: workspace of " + std::to_string(ws.bytes) +
                  " bytes, needs " + std::to_string(need) + " (detect_compact_workspace_bytes)");
  auto* const d_count = static_cast<std::size_t*>(ws.data);
  if (n == 0) {
    DCR_CUDA_TRY(cudaMemsetAsync(d_count, 0, sizeof(std::size_t), policy.stream));
    return d_count;
  }
  const std::size_t head = detail::align_up(sizeof(std::size_t));
  std::size_t temp = ws.bytes - head;
  DCR_CUDA_TRY(cub::DeviceSelect::If(static_cast<unsigned char*>(ws.data) + head, temp,
                                     detail::global_index_iterator{first_index}, out.index,
                                     d_count, static_cast<std::int64_t>(n),
                                     fn::changed_from<W>{{tracker, candidate}, first_index},
                                     policy.stream));
  if (out.old_words != nullptr || out.new_words != nullptr) {
    const fn::gather_changed<W> op{tracker, candidate, out.index, first_index, out.old_words,
                                   out.new_words};
    detail::for_each_counted_kernel<<<detail::blocks_for(n), detail::cuda_block, 0,
                                      policy.stream>>>(d_count, op);
    DCR_CUDA_TRY(cudaGetLastError());
  }
  return d_count;
}

/// detect_compact_async, then the count copied back (waits for the stream).
template <storage_word W>
std::size_t detect_compact(const cuda_policy& policy, const W* tracker, const W* candidate,
                           std::size_t n, changed_words<W> out, workspace ws,
                           std::uint64_t first_index = 0) {
  return wait_count(policy, detect_compact_async(policy, tracker, candidate, n, out, ws, first_index));
}

// ---- detect + project (the owner's affine stage on the device) ---------------------------------

/// Enqueues project over a count that lives in device memory (the slot detect_compact_async
/// returned): for k < *d_count, index[k], part[k] = mapping(local[k]) (part may be null). `local`
/// may equal `index` (projection in place: each k reads its own entry before writing it).
/// `capacity` bounds *d_count (it sizes the grid, nothing is read past *d_count). No host round
/// trip separates the compaction from the projection; allocates nothing, does not synchronize.
template <index_mapping M>
void project_counted_async(const cuda_policy& policy, const M& mapping, const std::uint64_t* local,
                           const std::size_t* d_count, std::size_t capacity, std::uint64_t* index,
                           std::uint32_t* part) {
  if (capacity == 0) return;
  const fn::project<M> op{mapping, local, index, part};
  detail::for_each_counted_kernel<<<detail::blocks_for(capacity), detail::cuda_block, 0,
                                    policy.stream>>>(d_count, op);
  DCR_CUDA_TRY(cudaGetLastError());
}

/// Detect + project of a whole source shard described by `mapping` (n == mapping.local_size()):
/// detect_compact_async (local indices, candidate words into out.new_words, tracker words into
/// out.old_words where not null), then project_counted_async in place, so out.index[k] is the
/// canonical index of the k-th changed element in increasing local order and part[k] its part
/// (part may be null; needed for multi-part mappings such as `stacked`). The output is in
/// increasing canonical order for every mapping that preserves order. Returns the device count
/// slot, valid once the stream reaches it; `ws` as for detect_compact. Throws
/// dcr::error(shape_mismatch) when n differs from the mapping's local size.
template <storage_word W, index_mapping M>
std::size_t* detect_project_async(const cuda_policy& policy, const W* tracker, const W* candidate,
                                  std::size_t n, const M& mapping, changed_words<W> out,
                                  std::uint32_t* part, workspace ws) {
  DCR_EXPECTS(n == mapping.local_size(), errc::shape_mismatch,
              "dcr::exec::detect_project: " + std::to_string(n) +
                  " words, the mapping's local size is " + std::to_string(mapping.local_size()));
  std::size_t* const d_count = detect_compact_async(policy, tracker, candidate, n, out, ws);
  project_counted_async(policy, mapping, out.index, d_count, n, out.index, part);
  return d_count;
}

/// detect_project_async, then the count copied back (waits for the stream).
template <storage_word W, index_mapping M>
std::size_t detect_project(const cuda_policy& policy, const W* tracker, const W* candidate,
                           std::size_t n, const M& mapping, changed_words<W> out,
                           std::uint32_t* part, workspace ws) {
  return wait_count(policy, detect_project_async(policy, tracker, candidate, n, mapping, out, part, ws));
}

// ---- detect + compact, pinned host tracker -----------------------------------------------------

namespace detail {

/// Appends one chunk's compacted indices at the running total: out[total + k] (index, the
/// tracker word from the staged chunk, the candidate word).
template <storage_word W>
struct append_chunk {
  const std::uint64_t* chunk_index;
  const std::size_t* chunk_count;
  const std::size_t* total;
  const W* staged;       // tracker words of the chunk
  const W* candidate;    // the whole candidate shard
  std::uint64_t first;   // first_index of the call
  std::uint64_t offset;  // chunk's first local index
  changed_words<W> out;
  __device__ void operator()(std::size_t k) const noexcept {
    const std::size_t at = *total + k;
    const std::uint64_t g = chunk_index[k];
    const std::uint64_t local = g - first;
    out.index[at] = g;
    if (out.old_words != nullptr) out.old_words[at] = staged[local - offset];
    if (out.new_words != nullptr) out.new_words[at] = candidate[local];
  }
};

template <class = void>  // a template: one definition across translation units
__global__ void add_count(std::size_t* total, const std::size_t* add) {
  *total += *add;
}

}  // namespace detail

/// Detect + compact against a tracker in pinned host memory (cudaMallocHost /
/// cudaHostRegister), streamed to the device in chunks of `chunk_words`, double-buffered: the
/// H2D copy of chunk c+1 runs on the pipeline's own copy stream while chunk c is compared on
/// policy.stream. Owns the copy stream and four events (created once, here); not thread-safe.
class pinned_tracker_pipeline {
 public:
  explicit pinned_tracker_pipeline(std::size_t chunk_words = std::size_t{1} << 24)
      : chunk_(chunk_words) {
    DCR_EXPECTS(chunk_words > 0, errc::invalid_argument,
                "pinned_tracker_pipeline: chunk of 0 words");
    DCR_CUDA_TRY(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    for (auto& e : copied_) DCR_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (auto& e : consumed_) DCR_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~pinned_tracker_pipeline() {
    for (auto e : copied_) (void)cudaEventDestroy(e);
    for (auto e : consumed_) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(copy_);
  }
  pinned_tracker_pipeline(const pinned_tracker_pipeline&) = delete;
  pinned_tracker_pipeline& operator=(const pinned_tracker_pipeline&) = delete;

  [[nodiscard]] std::size_t chunk_words() const noexcept { return chunk_; }

  /// Device workspace for shards of up to n words: two count slots, two tracker chunks, one
  /// chunk of indices and CUB's scratch for one chunk.
  template <storage_word W>
  std::size_t workspace_bytes(const cuda_policy& policy, std::size_t n) const {
    const std::size_t c = std::min(chunk_, std::max<std::size_t>(n, 1));
    return layout<W>(c, detail::select_temp_bytes<W>(c, policy.stream)).total;
  }

  /// Enqueues the pipeline; returns the device address of the total count (valid once
  /// policy.stream reaches it; wait_count(policy, address) waits and reads it). `tracker` is pinned host memory, `candidate` and `out` device
  /// memory (out of capacity n), `ws` at least workspace_bytes<W>(policy, n).
  template <storage_word W>
  std::size_t* detect_compact_async(const cuda_policy& policy, const W* tracker,
                                    const W* candidate, std::size_t n, changed_words<W> out,
                                    workspace ws, std::uint64_t first_index = 0) {
    const std::size_t c = std::min(chunk_, std::max<std::size_t>(n, 1));
    const auto l = layout<W>(c, detail::select_temp_bytes<W>(c, policy.stream));
    DCR_EXPECTS(ws.data != nullptr && ws.bytes >= l.total, errc::invalid_argument,
                "pinned_tracker_pipeline: workspace of " + std::to_string(ws.bytes) +
                    " bytes, needs " + std::to_string(l.total) + " (workspace_bytes)");
    auto* const base = static_cast<unsigned char*>(ws.data);
    auto* const total = reinterpret_cast<std::size_t*>(base + l.total_slot);
    auto* const chunk_count = reinterpret_cast<std::size_t*>(base + l.count_slot);
    auto* const chunk_index = reinterpret_cast<std::uint64_t*>(base + l.index);
    W* const stage[2] = {reinterpret_cast<W*>(base + l.stage[0]),
                         reinterpret_cast<W*>(base + l.stage[1])};
    DCR_CUDA_TRY(cudaMemsetAsync(total, 0, sizeof(std::size_t), policy.stream));
    // The copy stream starts after everything already enqueued on the compute stream (an
    // earlier call may still read the stages).
    DCR_CUDA_TRY(cudaEventRecord(consumed_[0], policy.stream));
    DCR_CUDA_TRY(cudaEventRecord(consumed_[1], policy.stream));
    const std::size_t chunks = (n + c - 1) / c;
    const auto issue_copy = [&](std::size_t q) {
      const int b = static_cast<int>(q % 2);
      const std::size_t off = q * c, len = std::min(c, n - off);
      DCR_CUDA_TRY(cudaStreamWaitEvent(copy_, consumed_[b], 0));
      DCR_CUDA_TRY(cudaMemcpyAsync(stage[b], tracker + off, len * sizeof(W),
                                   cudaMemcpyHostToDevice, copy_));
      DCR_CUDA_TRY(cudaEventRecord(copied_[b], copy_));
    };
    if (chunks > 0) issue_copy(0);
    for (std::size_t q = 0; q < chunks; ++q) {
      const int b = static_cast<int>(q % 2);
      const std::size_t off = q * c, len = std::min(c, n - off);
      if (q + 1 < chunks) issue_copy(q + 1);  // overlaps the compare below
      DCR_CUDA_TRY(cudaStreamWaitEvent(policy.stream, copied_[b], 0));
      std::size_t temp = l.temp_bytes;
      DCR_CUDA_TRY(cub::DeviceSelect::If(
          base + l.temp, temp, detail::global_index_iterator{first_index + off}, chunk_index,
          chunk_count, static_cast<std::int64_t>(len),
          fn::changed_from<W>{{stage[b], candidate + off}, first_index + off}, policy.stream));
      const detail::append_chunk<W> op{chunk_index, chunk_count, total,      stage[b],
                                       candidate,   first_index, off,        out};
      detail::for_each_counted_kernel<<<detail::blocks_for(len), detail::cuda_block, 0,
                                        policy.stream>>>(chunk_count, op);
      DCR_CUDA_TRY(cudaGetLastError());
      detail::add_count<><<<1, 1, 0, policy.stream>>>(total, chunk_count);
      DCR_CUDA_TRY(cudaGetLastError());
      DCR_CUDA_TRY(cudaEventRecord(consumed_[b], policy.stream));
    }
    return total;
  }

 private:
  struct slots {
    std::size_t total_slot = 0, count_slot = 0, index = 0, stage[2] = {0, 0}, temp = 0;
    std::size_t temp_bytes = 0, total = 0;
  };
  template <storage_word W>
  static slots layout(std::size_t c, std::size_t temp_bytes) {
    using detail::align_up;
    slots s;
    s.total_slot = 0;
    s.count_slot = align_up(sizeof(std::size_t));
    s.index = s.count_slot + align_up(sizeof(std::size_t));
    s.stage[0] = s.index + align_up(c * sizeof(std::uint64_t));
    s.stage[1] = s.stage[0] + align_up(c * sizeof(W));
    s.temp = s.stage[1] + align_up(c * sizeof(W));
    s.temp_bytes = temp_bytes;
    s.total = s.temp + align_up(temp_bytes);
    return s;
  }

  std::size_t chunk_;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  cudaEvent_t consumed_[2] = {nullptr, nullptr};
};

// ---- the per-record apply ----------------------------------------------------------------------

namespace detail {

/// One block row per placement record (blockIdx.y, grid-strided over records): the block finds
/// the record's window in the sorted active indices by binary search, then its threads apply
/// the step to the window's records; writes are counted into *writes.
template <class E, storage_word W>
__global__ void __launch_bounds__(cuda_block)
    apply_records_kernel(const placement* __restrict__ records, std::size_t r,
                         const std::uint64_t* __restrict__ active, std::size_t m,
                         const W* __restrict__ values, unsigned long long* __restrict__ writes) {
  __shared__ unsigned long long block_writes;
  if (threadIdx.x == 0) block_writes = 0;
  __syncthreads();
  unsigned long long mine = 0;
  for (std::size_t q = blockIdx.y; q < r; q += gridDim.y) {
    const placement& p = records[q];
    const std::size_t k0 = fn::bound_index(active, m, static_cast<std::uint64_t>(p.first), false);
    const std::size_t k1 = fn::bound_index(active, m, static_cast<std::uint64_t>(p.last), true);
    // The step straight on the record in global memory (read through the read-only cache): no
    // per-thread copy of the ~370-byte record, as fn::apply_step (a value) would make.
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t k = k0 + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         k < k1; k += stride)
      mine += apply_record_any<E, W>(p, active[k], values[k]) ? 1 : 0;
  }
  if (mine != 0) atomicAdd(&block_writes, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_writes != 0) atomicAdd(writes, block_writes);
}

}  // namespace detail

/// Device workspace of apply_item_records: the write counter.
inline constexpr std::size_t apply_workspace_bytes(const cuda_policy&) noexcept {
  return sizeof(unsigned long long);
}

/// Enqueues the per-record apply of one item through r placement records (device memory: a
/// device copy of placement_plan::placements_of(tensor), whose dst pointers are device
/// storage) with sorted active indices and values (device memory). The write count lands in
/// the workspace (returned). Allocates nothing, does not synchronize. The caller has validated
/// the item against the plan (as item_applier::apply does) before the first write.
template <storage_word W>
unsigned long long* apply_item_records_async(const cuda_policy& policy, const placement* records,
                                             std::size_t r, encoding enc,
                                             const std::uint64_t* active, std::size_t m,
                                             const W* values, workspace ws) {
  DCR_EXPECTS(ws.data != nullptr && ws.bytes >= apply_workspace_bytes(policy),
              errc::invalid_argument, "dcr::exec::apply_item_records: no write-counter workspace");
  auto* const writes = static_cast<unsigned long long*>(ws.data);
  DCR_CUDA_TRY(cudaMemsetAsync(writes, 0, sizeof *writes, policy.stream));
  if (r == 0 || m == 0) return writes;
  const std::size_t per_record = (m + r - 1) / r;
  const dim3 grid(static_cast<unsigned>(std::clamp<std::size_t>(
                      (per_record + detail::cuda_block - 1) / detail::cuda_block, 1, 1024)),
                  static_cast<unsigned>(std::min<std::size_t>(r, 65535)));
  visit_encoding(enc, [&](auto e) {
    detail::apply_records_kernel<std::remove_cvref_t<decltype(e)>, W>
        <<<grid, detail::cuda_block, 0, policy.stream>>>(records, r, active, m, values, writes);
  });
  DCR_CUDA_TRY(cudaGetLastError());
  return writes;
}

/// apply_item_records_async, then the write count copied back (waits for the stream).
template <storage_word W>
std::uint64_t apply_item_records(const cuda_policy& policy, const placement* records,
                                 std::size_t r, encoding enc, const std::uint64_t* active,
                                 std::size_t m, const W* values, workspace ws) {
  unsigned long long* const d = apply_item_records_async(policy, records, r, enc, active, m,
                                                         values, ws);
  unsigned long long writes = 0;
  DCR_CUDA_TRY(cudaMemcpyAsync(&writes, d, sizeof writes, cudaMemcpyDeviceToHost, policy.stream));
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  return writes;
}

}  // namespace dcr::exec
