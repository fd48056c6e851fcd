// dcr/detect/detect.hpp: change detection, bit by bit.
//
// An owner compares its candidate shard with its tracker (the committed version-v words) and
// collects the local indices whose stored words differ. Comparison is always on stored bits:
// float equality would call -0 and +0 equal and every NaN unequal, and would miss or invent
// changes. The per-element predicate `bits_differ` is shared with the CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// True when two stored words differ in any bit.
struct bits_differ {
  template <class W>
  DCR_HOST_DEVICE constexpr bool operator()(W a, W b) const noexcept {
    return a != b;
  }
};

namespace detail {

/// Bit k set when words k of the two 64-byte blocks differ (64 / sizeof(W) words per block).
template <storage_word W>
DCR_FORCE_INLINE std::uint64_t block_diff_mask(const W* a, const W* b) noexcept {
  constexpr std::size_t n = 64 / sizeof(W);
  std::uint64_t mask = 0;
  for (std::size_t k = 0; k < n; ++k) mask |= static_cast<std::uint64_t>(a[k] != b[k]) << k;
  return mask;
}

/// True when the 64-byte blocks differ anywhere (vectorizes to a few wide compares).
DCR_FORCE_INLINE bool block_differs(const std::byte* a, const std::byte* b) noexcept {
  std::uint64_t x[8], y[8];
  std::memcpy(x, a, 64);
  std::memcpy(y, b, 64);
  std::uint64_t acc = 0;
  for (int k = 0; k < 8; ++k) acc |= x[k] ^ y[k];
  return acc != 0;
}

}  // namespace detail

/// Appends to `changed`, in increasing order, `first_index + j` for every j where the stored
/// words tracker[j] and candidate[j] differ. Both spans must have the same length. Returns the
/// number of indices appended. Runs near memory bandwidth on one core: unchanged 64-byte blocks
/// cost one wide compare; only blocks with a change are scanned word by word.
template <storage_word W>
std::size_t detect_changes(std::span<const W> tracker, std::span<const W> candidate,
                           std::vector<std::uint64_t>& changed, std::uint64_t first_index = 0) {
  DCR_EXPECTS(tracker.size() == candidate.size(), errc::shape_mismatch,
              "detect_changes: tracker and candidate differ in length");
  constexpr std::size_t per_block = 64 / sizeof(W);
  const std::size_t n = tracker.size();
  const std::size_t before = changed.size();
  const W* a = tracker.data();
  const W* b = candidate.data();
  std::size_t j = 0;
  for (; j + per_block <= n; j += per_block) {
    if (!detail::block_differs(reinterpret_cast<const std::byte*>(a + j),
                               reinterpret_cast<const std::byte*>(b + j)))
      continue;
    std::uint64_t mask = detail::block_diff_mask(a + j, b + j);
    while (mask != 0) {
      changed.push_back(first_index + j + static_cast<std::uint64_t>(__builtin_ctzll(mask)));
      mask &= mask - 1;
    }
  }
  for (; j < n; ++j)
    if (bits_differ{}(a[j], b[j])) changed.push_back(first_index + j);
  return changed.size() - before;
}

/// Gathers words[indices[k]] into out[k] (old or new bits of the changed elements).
template <storage_word W>
void gather_words(std::span<const W> words, std::span<const std::uint64_t> indices,
                  std::span<W> out, std::uint64_t first_index = 0) {
  DCR_EXPECTS(out.size() == indices.size(), errc::shape_mismatch,
              "gather_words: output size differs from index count");
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::uint64_t j = indices[k] - first_index;
    DCR_EXPECTS(j < words.size(), errc::out_of_range, "gather_words: index outside the shard");
    out[k] = words[j];
  }
}

}  // namespace dcr
