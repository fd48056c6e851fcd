// dcr/exec/algorithms.hpp: the refit's data-parallel steps as algorithms over an execution
// policy (dcr/exec/policy.hpp), with their CPU implementations.
//
// Every algorithm takes the policy first, then raw pointers in the policy's memory space (host
// memory for cpu_policy and for thrust_policy on the CPP/OMP systems, device memory for
// cuda_policy), then a caller-owned `workspace` where it needs scratch. Results are bit for bit
// the same on every backend (tests/exec checks them against each other on randomized inputs).
//
//   detect_compact(policy, tracker, candidate, n, out, ws, first_index)
//       sorted changed local indices (+ first_index) with their old and new words; returns the
//       count. Workspace: detect_compact_workspace_bytes<W>(policy, n).
//   project(policy, mapping, local, m, index, part)        local -> canonical (part, index)
//   gather(policy, words, index, m, out)                    out[k] = words[index[k]]
//   encode_values(policy, enc, old, new, m, out)            out[k] = E::encode(old[k], new[k])
//   location_skips(policy, indices, m, out)                 the location codings' skips
//   split_byte_planes(policy, words, m, zigzag, planes)     byte planes of the value streams
//   update_tracker(policy, tracker, local, new_words, m)    after a commit: scatter new words
//   apply_item_records(policy, records, r, enc, active, m, values, ws)
//       the per-record apply step (dcr/apply/record.hpp) through r compiled placement records;
//       returns the writes. The records' dst pointers must be in the policy's memory space.
//       Workspace: apply_workspace_bytes(policy).
//
// Memory of the policy's space, for code written once over the policy (dcr/exec/refit.hpp):
//   make_buffer<T>(policy, count)             an owning array (host_buffer here, device_buffer
//                                             on CUDA): data(), size(), as_workspace()
//   upload(policy, dst, src, count)           policy space <- host; src must stay unchanged
//                                             until the next download or synchronize
//   download(policy, dst, src, count)         host <- policy space, after all earlier work of
//                                             the policy; complete when it returns
//   synchronize(policy)                       waits for all work enqueued on the policy
//
// The generic ones are written once here over `for_each_index(policy, m, op)`, each backend's
// loop primitive; detect_compact and apply_item_records have one implementation per backend
// (SIMD compare on the CPU, copy_if under Thrust, CUB select on CUDA; a host binary search per
// record on the CPU and Thrust, a block per record on CUDA). Preconditions the algorithms do not
// re-check (they run where throwing is not possible): indices in range, outputs of capacity m
// (n for detect_compact), `active` strictly increasing, and for apply the plan's checks
// (dcr::item_applier::apply validates items; xor/ulp only on bit-preserving records).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <type_traits>

#include "dcr/apply/record.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/exec/functors.hpp"
#include "dcr/exec/policy.hpp"
#include "dcr/mapping/concept.hpp"

namespace dcr::exec {

namespace detail {

inline constexpr unsigned max_cpu_threads = 256;

/// Splits [0, n) into at most `threads` parts whose boundaries are multiples of `align`, runs
/// f(part, begin, end) for each (part 0 on the calling thread) and returns the number of parts.
template <class F>
unsigned run_parts(unsigned threads, std::size_t n, std::size_t align, F&& f) {
  const std::size_t units = (n + align - 1) / align;
  unsigned parts = std::min<unsigned>(std::max(1u, std::min(threads, max_cpu_threads)),
                                      static_cast<unsigned>(std::min<std::size_t>(
                                          units != 0 ? units : 1, max_cpu_threads)));
  const auto bound = [&](unsigned p) {
    return std::min(n, static_cast<std::size_t>(units * p / parts) * align);
  };
  if (parts == 1) {
    f(0u, std::size_t{0}, n);
    return 1;
  }
  std::array<std::thread, max_cpu_threads> pool;
  for (unsigned p = 1; p < parts; ++p) pool[p] = std::thread([&, p] { f(p, bound(p), bound(p + 1)); });
  f(0u, bound(0), bound(1));
  for (unsigned p = 1; p < parts; ++p) pool[p].join();
  return parts;
}

}  // namespace detail

// ---- the CPU backend's memory: host memory ----------------------------------------------------

/// An owning array of `count` T in host memory (uninitialized), the CPU policy's buffer.
template <class T>
class host_buffer {
 public:
  explicit host_buffer(std::size_t count)
      : data_(std::make_unique_for_overwrite<T[]>(count)), count_(count) {}
  [[nodiscard]] T* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  [[nodiscard]] workspace as_workspace() const noexcept { return {data_.get(), bytes()}; }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t count_;
};

/// `count` T in the CPU policy's memory space (host memory).
template <class T>
host_buffer<T> make_buffer(const cpu_policy&, std::size_t count) {
  return host_buffer<T>(count);
}

/// dst <- src, `count` T (both host memory on the CPU policy).
template <class T>
void upload(const cpu_policy&, T* dst, const T* src, std::size_t count) {
  if (count != 0) std::memcpy(dst, src, count * sizeof(T));
}
template <class T>
void download(const cpu_policy&, T* dst, const T* src, std::size_t count) {
  if (count != 0) std::memcpy(dst, src, count * sizeof(T));
}

/// The CPU policy runs every step before returning: nothing to wait for.
inline void synchronize(const cpu_policy&) noexcept {}

// ---- the CPU backend's primitives -------------------------------------------------------------

/// Calls op(k) for every k in [0, m) (any order across threads, in order within each).
template <class Op>
void for_each_index(const cpu_policy& policy, std::size_t m, Op op) {
  detail::run_parts(policy.threads, m, 4096, [&](unsigned, std::size_t b, std::size_t e) {
    for (std::size_t k = b; k < e; ++k) op(k);
  });
}

/// Workspace detect_compact needs on the CPU: none.
template <storage_word W>
constexpr std::size_t detect_compact_workspace_bytes(const cpu_policy&, std::size_t) noexcept {
  return 0;
}

/// detect_compact on the CPU: the SIMD compare-and-gather loop of dcr/detect/detect.hpp, on each
/// thread's part; the parts' results are then moved down to be contiguous (outputs hold n
/// entries, so each part writes at its own offset first).
template <storage_word W>
std::size_t detect_compact(const cpu_policy& policy, const W* tracker, const W* candidate,
                           std::size_t n, changed_words<W> out, workspace = {},
                           std::uint64_t first_index = 0) {
  std::array<std::size_t, detail::max_cpu_threads> found{};
  std::array<std::size_t, detail::max_cpu_threads> begin{};
  const unsigned parts = detail::run_parts(
      policy.threads, n, std::size_t{1} << 16, [&](unsigned p, std::size_t b, std::size_t e) {
        begin[p] = b;
        found[p] = dcr::detail::detect_and_gather_to<W>(
            tracker + b, candidate + b, e - b, out.index + b,
            out.old_words != nullptr ? out.old_words + b : nullptr,
            out.new_words != nullptr ? out.new_words + b : nullptr, first_index + b);
      });
  std::size_t count = found[0];
  for (unsigned p = 1; p < parts; ++p) {
    const std::size_t b = begin[p], k = found[p];
    if (k != 0 && b != count) {
      std::memmove(out.index + count, out.index + b, k * sizeof(std::uint64_t));
      if (out.old_words != nullptr) std::memmove(out.old_words + count, out.old_words + b, k * sizeof(W));
      if (out.new_words != nullptr) std::memmove(out.new_words + count, out.new_words + b, k * sizeof(W));
    }
    count += k;
  }
  return count;
}

/// Workspace apply_item_records needs on the CPU: none.
constexpr std::size_t apply_workspace_bytes(const cpu_policy&) noexcept { return 0; }

/// The per-record apply step on the CPU (dcr::apply_item_records: window by binary search, then
/// the batched loop). Returns the writes.
template <storage_word W>
std::uint64_t apply_item_records(const cpu_policy&, const placement* records, std::size_t r,
                                 encoding enc, const std::uint64_t* active, std::size_t m,
                                 const W* values, workspace = {}) {
  return dcr::apply_item_records<W>(std::span<const placement>(records, r), enc,
                                    std::span<const std::uint64_t>(active, m), values);
}

// ---- algorithms written once over for_each_index ----------------------------------------------

/// index[k], part[k] = mapping(local[k]) (part may be null).
template <execution_policy P, index_mapping M>
void project(const P& policy, const M& mapping, const std::uint64_t* local, std::size_t m,
             std::uint64_t* index, std::uint32_t* part) {
  for_each_index(policy, m, fn::project<M>{mapping, local, index, part});
}

/// out[k] = words[index[k]].
template <execution_policy P, storage_word W>
void gather(const P& policy, const W* words, const std::uint64_t* index, std::size_t m, W* out) {
  for_each_index(policy, m, fn::gather<W>{words, index, out});
}

/// out[k] = E::encode(old_words[k], new_words[k]) for the policy type E of `enc` (the item
/// values an owner sends). Throws errc::unsupported_version for an encoding this build lacks.
template <execution_policy P, storage_word W>
void encode_values(const P& policy, encoding enc, const W* old_words, const W* new_words,
                   std::size_t m, W* out) {
  visit_encoding(enc, [&](auto e) {
    for_each_index(policy, m, fn::encode_value<std::remove_cvref_t<decltype(e)>, W>{old_words, new_words, out});
  });
}

/// out[k] = dcr::location_skip(indices, k): what the skip location codings store.
template <execution_policy P>
void location_skips(const P& policy, const std::uint64_t* indices, std::size_t m,
                    std::uint64_t* out) {
  for_each_index(policy, m, fn::location_skips{indices, out});
}

/// The sizeof(W) byte planes of m words (planes[b * m + k]), zigzag-mapped first when `zigzag`:
/// the layout of the byte_planes / zigzag_planes value codings before zstd.
template <execution_policy P, storage_word W>
void split_byte_planes(const P& policy, const W* words, std::size_t m, bool zigzag,
                       std::byte* planes) {
  if (zigzag)
    for_each_index(policy, m, fn::byte_planes<W, true>{words, m, planes});
  else
    for_each_index(policy, m, fn::byte_planes<W, false>{words, m, planes});
}

/// After the commit of a transition: tracker[local[k]] = new_words[k] (the owner's baseline
/// becomes the committed version). `local` holds distinct indices.
template <execution_policy P, storage_word W>
void update_tracker(const P& policy, W* tracker, const std::uint64_t* local,
                    const W* new_words, std::size_t m) {
  for_each_index(policy, m, fn::update_tracker<W>{tracker, local, new_words});
}

}  // namespace dcr::exec
