// dcr/exec/functors.hpp: the per-index operations of the exec algorithms, written once for
// every backend.
//
// Each functor is a trivially copyable value holding raw pointers (host or device memory,
// whatever the policy's memory space is) whose `operator()(k)` does the work of one index k and
// is DCR_HOST_DEVICE. The CPU policy calls it in a loop, Thrust in thrust::for_each_n, the CUDA
// backend in a grid-stride kernel. The element rules themselves live in the library's headers:
// dcr::bits_differ (detect), the mapping classes' operator() (project), the value encodings'
// encode (xor, ulp, overwrite), dcr::location_skip and dcr::split_into_planes (stream helpers),
// dcr::apply_record (the per-record apply step through a compiled placement record).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dcr/apply/record.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/config.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/dtype.hpp"
#include "dcr/mapping/concept.hpp"

namespace dcr::exec {

/// Where detect_compact writes: for the k-th changed element (increasing local index), its
/// local index (plus the call's first_index), its tracker word and its candidate word. Each
/// array holds at least n entries (the worst case: every element changed). `old_words` or
/// `new_words` may be null when not wanted.
template <storage_word W>
struct changed_words {
  std::uint64_t* index = nullptr;
  W* old_words = nullptr;
  W* new_words = nullptr;
};

namespace fn {

/// Whether local element i changed: the stored words differ in any bit.
template <storage_word W>
struct word_changed {
  const W* tracker;
  const W* candidate;
  DCR_HOST_DEVICE bool operator()(std::uint64_t i) const noexcept {
    return bits_differ{}(tracker[i], candidate[i]);
  }
};

/// After compaction: the old and new words of changed record k (index[k] - first is local).
template <storage_word W>
struct gather_changed {
  const W* tracker;
  const W* candidate;
  const std::uint64_t* index;
  std::uint64_t first;
  W* old_words;
  W* new_words;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    const std::uint64_t i = index[k] - first;
    if (old_words != nullptr) old_words[k] = tracker[i];
    if (new_words != nullptr) new_words[k] = candidate[i];
  }
};

/// Local index -> canonical (part, index) through mapping M.
template <index_mapping M>
struct project {
  M mapping;
  const std::uint64_t* local;
  std::uint64_t* index;
  std::uint32_t* part;  // may be null
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    const mapped_index to = mapping(local[k]);
    index[k] = to.index;
    if (part != nullptr) part[k] = to.part;
  }
};

/// out[k] = words[index[k]].
template <storage_word W>
struct gather {
  const W* words;
  const std::uint64_t* index;
  W* out;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept { out[k] = words[index[k]]; }
};

/// The value an owner sends for record k: E::encode(old, new).
template <class E, storage_word W>
struct encode_value {
  const W* old_words;
  const W* new_words;
  W* out;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    out[k] = E::template encode<W>(old_words[k], new_words[k]);
  }
};

/// The location skip of record k (dcr::location_skip).
struct location_skips {
  const std::uint64_t* indices;
  std::uint64_t* out;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    out[k] = location_skip(indices, k);
  }
};

/// The byte planes of record k of n (dcr::split_into_planes).
template <storage_word W, bool Zig>
struct byte_planes {
  const W* words;
  std::size_t n;
  std::byte* planes;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    split_into_planes<W, Zig>(words[k], k, n, planes);
  }
};

/// After a commit: tracker[local[k]] = new_words[k].
template <storage_word W>
struct update_tracker {
  W* tracker;
  const std::uint64_t* local;
  const W* new_words;
  DCR_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    tracker[local[k]] = new_words[k];
  }
};

/// Whether global index i (local i - first) changed: the predicate of the compactions.
template <storage_word W>
struct changed_from {
  word_changed<W> changed;
  std::uint64_t first;
  DCR_HOST_DEVICE bool operator()(std::uint64_t i) const noexcept { return changed(i - first); }
};

/// The per-record apply step for item record k through placement record `p`
/// (dcr::apply_record_any: the record's transform chosen at run time); 1 for a write, 0 for an
/// index that is not an element of the record. The backends call it for k in p's window.
template <class E, storage_word W>
struct apply_step {
  placement p;
  const std::uint64_t* active;
  const W* values;
  DCR_HOST_DEVICE std::uint64_t operator()(std::size_t k) const noexcept {
    return apply_record_any<E, W>(p, active[k], values[k]) ? 1 : 0;
  }
};

/// First position in sorted a[0, n) whose value is not below v (with `upper`: above v).
DCR_HOST_DEVICE inline std::size_t bound_index(const std::uint64_t* a, std::size_t n,
                                               std::uint64_t v, bool upper) noexcept {
  std::size_t lo = 0, hi = n;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (upper ? a[mid] <= v : a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace fn

}  // namespace dcr::exec
