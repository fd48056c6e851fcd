// dcr/exec/policy.hpp: execution policies, one per backend, in the style of Thrust's
// per-backend policies (thrust::cpp::par, thrust::cuda::par.on(stream)).
//
// An execution policy is a small value that says *where* an algorithm of dcr/exec/algorithms.hpp
// runs; the algorithm says *what* runs, through the per-element functors of
// dcr/exec/functors.hpp, which are the same on every backend. Three backends:
//   * dcr::exec::cpu_policy (this header): the calling thread, or `threads` threads that split
//     the index range; the CPU detect uses the SIMD compare loops of dcr/detect/detect.hpp;
//   * dcr::exec::thrust_policy<P> (dcr/exec/thrust.hpp, needs the CCCL headers): the same
//     algorithms through Thrust on any Thrust system P (thrust::cpp::par, thrust::omp::par under
//     plain g++; thrust::cuda::par under nvcc). The host-testable twin of the CUDA backend;
//   * dcr::exec::cuda_policy (kernels/dcr/kernels/exec.cuh, nvcc only): a CUDA stream and a
//     device memory resource; kernels and CUB, workspace supplied by the caller.
// A policy opts in with `using policy_concept = dcr::exec::policy_tag;` (checked by
// execution_policy), so third-party backends can be added beside these.
//
// Workspace (the CUB two-phase style): every algorithm with scratch needs has a
// `*_workspace_bytes(policy, n)` query; callers size a workspace once (per shard, per receiver)
// and pass it to every step. No algorithm allocates inside a step on the CPU and CUDA backends
// (a threaded cpu_policy starts its threads per call: std::thread's own state is the one
// allocation, documented there).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <type_traits>

namespace dcr::exec {

/// Opt-in tag of an execution policy.
struct policy_tag {};

/// An execution policy type: opts in through `policy_concept`.
template <class P>
concept execution_policy =
    std::derived_from<typename std::remove_cvref_t<P>::policy_concept, policy_tag>;

/// Caller-owned scratch memory of an algorithm, in the policy's memory space (host memory for
/// cpu_policy, device memory for cuda_policy). `bytes` at least what the algorithm's
/// *_workspace_bytes query returned; a null workspace of 0 bytes where it returned 0.
struct workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// The CPU backend. threads == 1 (the default): everything on the calling thread. threads > 1:
/// index ranges are split into `threads` contiguous parts, one std::thread each (started per
/// call, joined before return: about 20 us and one small allocation per thread, so use it for
/// shards of megabytes, not for small calls). Results are identical for every thread count.
struct cpu_policy {
  using policy_concept = policy_tag;
  unsigned threads = 1;

  /// The same policy on `n` threads (0 = std::thread::hardware_concurrency()).
  [[nodiscard]] cpu_policy on(unsigned n) const noexcept {
    cpu_policy p = *this;
    p.threads = n != 0 ? n : (std::thread::hardware_concurrency() != 0
                                  ? std::thread::hardware_concurrency()
                                  : 1u);
    return p;
  }
};

/// The calling thread (dcr::exec::cpu.on(4) for four threads).
inline constexpr cpu_policy cpu{};

static_assert(execution_policy<cpu_policy>);

}  // namespace dcr::exec
