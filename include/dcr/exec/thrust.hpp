// dcr/exec/thrust.hpp: the exec algorithms through Thrust, on any Thrust system.
//
// thrust_policy<P> wraps a Thrust execution policy P and runs the algorithms of
// dcr/exec/algorithms.hpp with Thrust's algorithms and the same per-index functors
// (dcr/exec/functors.hpp) the CPU and CUDA backends call:
//   * under plain g++/clang++ with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP (or _OMP with
//     -fopenmp) and the CUDA toolkit's include/cccl folder on the include path, P is
//     thrust::cpp::par_t or thrust::omp::par_t: GPU-shaped code (compaction by copy_if, index
//     loops by for_each_n, windows by lower_bound) that runs and is tested on a CPU;
//   * under nvcc, P may be thrust::cuda::par.on(stream) (then pointers are device pointers);
//     the CUDA backend proper is dcr::exec::cuda_policy (kernels/dcr/kernels/exec.cuh), which
//     uses caller workspace instead of Thrust's temporary allocations.
// Not included by dcr.hpp: including it needs the CCCL headers.
//
// apply_item_records reads the placement records on the host (one window search and one
// for_each per record), so they must be host-accessible: host memory on CPP/OMP.
#pragma once

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "dcr/exec/algorithms.hpp"

namespace dcr::exec {

/// The Thrust backend over Thrust execution policy P (e.g. thrust::cpp::par_t).
template <class P>
struct thrust_policy {
  using policy_concept = policy_tag;
  P system{};
};

/// thrust_policy over a Thrust policy value: dcr::exec::on_thrust(thrust::cpp::par).
template <class P>
thrust_policy<P> on_thrust(const P& system) {
  return thrust_policy<P>{system};
}

/// Calls op(k) for k in [0, m) through thrust::for_each_n.
template <class P, class Op>
void for_each_index(const thrust_policy<P>& policy, std::size_t m, Op op) {
  if (m == 0) return;
  thrust::for_each_n(policy.system, thrust::counting_iterator<std::size_t>(0), m, op);
}

/// Thrust allocates copy_if's scratch itself (none on CPP/OMP): no dcr workspace.
template <storage_word W, class P>
constexpr std::size_t detect_compact_workspace_bytes(const thrust_policy<P>&, std::size_t) noexcept {
  return 0;
}


/// detect_compact: compaction of the changed global indices by thrust::copy_if (stable: sorted),
/// then the old and new words gathered by index.
template <storage_word W, class P>
std::size_t detect_compact(const thrust_policy<P>& policy, const W* tracker, const W* candidate,
                           std::size_t n, changed_words<W> out, workspace = {},
                           std::uint64_t first_index = 0) {
  if (n == 0) return 0;
  const thrust::counting_iterator<std::uint64_t> first(first_index);
  std::uint64_t* const end =
      thrust::copy_if(policy.system, first, first + n, out.index,
                      fn::changed_from<W>{{tracker, candidate}, first_index});
  const auto count = static_cast<std::size_t>(end - out.index);
  for_each_index(policy, count,
                 fn::gather_changed<W>{tracker, candidate, out.index, first_index, out.old_words,
                                       out.new_words});
  return count;
}

/// Thrust allocates what apply_item_records needs itself: no dcr workspace.
template <class P>
constexpr std::size_t apply_workspace_bytes(const thrust_policy<P>&) noexcept {
  return 0;
}

/// The per-record apply step: per record, its window in `active` by thrust::lower_bound /
/// upper_bound, then the step for each index of the window, the writes counted by
/// thrust::transform_reduce.
template <storage_word W, class P>
std::uint64_t apply_item_records(const thrust_policy<P>& policy, const placement* records,
                                 std::size_t r, encoding enc, const std::uint64_t* active,
                                 std::size_t m, const W* values, workspace = {}) {
  std::uint64_t writes = 0;
  for (std::size_t q = 0; q < r; ++q) {
    const placement& p = records[q];
    const std::uint64_t* lo =
        thrust::lower_bound(policy.system, active, active + m, static_cast<std::uint64_t>(p.first));
    const std::uint64_t* hi =
        thrust::upper_bound(policy.system, lo, active + m, static_cast<std::uint64_t>(p.last));
    if (lo == hi) continue;
    const auto k0 = static_cast<std::size_t>(lo - active);
    const auto k1 = static_cast<std::size_t>(hi - active);
    writes += visit_encoding(enc, [&](auto e) -> std::uint64_t {
      const thrust::counting_iterator<std::size_t> k(k0);
      return thrust::transform_reduce(policy.system, k, k + (k1 - k0),
                                      fn::apply_step<std::remove_cvref_t<decltype(e)>, W>{p, active, values},
                                      std::uint64_t{0}, thrust::plus<std::uint64_t>());
    });
  }
  return writes;
}

}  // namespace dcr::exec
