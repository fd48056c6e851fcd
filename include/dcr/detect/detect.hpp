// dcr/detect/detect.hpp: change detection, bit by bit.
//
// An owner compares its candidate shard with its tracker (the committed version-v words) and
// collects the local indices whose stored words differ. Comparison is always on stored bits:
// float equality would call -0 and +0 equal and every NaN unequal, and would miss or invent
// changes. The per-element predicate `bits_differ` is shared with the CUDA kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "dcr/config.hpp"
#include "dcr/detail/detect_simd.hpp"
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

/// Appends to `changed`, in increasing order, `first_index + j` for every j where the stored
/// words tracker[j] and candidate[j] differ. Both spans must have the same length. Returns the
/// number of indices appended. Runs near memory bandwidth on one core: each 64-byte block costs
/// one or two SIMD compares (AVX-512 or AVX2, chosen at run time; a portable loop elsewhere),
/// and changed words are compacted as 16-bit offsets in a small on-stack buffer, then widened,
/// so `changed` grows only by what is found.
template <storage_word W>
std::size_t detect_changes(std::span<const W> tracker, std::span<const W> candidate,
                           std::vector<std::uint64_t>& changed, std::uint64_t first_index = 0) {
  DCR_EXPECTS(tracker.size() == candidate.size(), errc::shape_mismatch,
              "detect_changes: tracker and candidate differ in length");
  constexpr std::size_t per_block = 64 / sizeof(W);
  constexpr std::size_t chunk = detail::detect_chunk_words;
  static_assert(chunk % per_block == 0);
  const std::size_t n = tracker.size();
  const std::size_t before = changed.size();
  const W* a = tracker.data();
  const W* b = candidate.data();
  const auto loop = detail::best_detect_loop<W>();
  std::uint16_t offsets[chunk + detail::detect_out_slack];
  const std::size_t whole = n / per_block * per_block;
  for (std::size_t j = 0; j < whole; j += chunk) {
    const std::size_t len = std::min(chunk, whole - j);
    const std::size_t k = loop(a + j, b + j, len, offsets);
    if (k == 0) continue;
    const std::size_t at = changed.size();
    changed.resize(at + k);
    std::uint64_t* out = changed.data() + at;
    const std::uint64_t base = first_index + j;
    for (std::size_t q = 0; q < k; ++q) out[q] = base + offsets[q];
  }
  for (std::size_t j = whole; j < n; ++j)
    if (bits_differ{}(a[j], b[j])) changed.push_back(first_index + j);
  return changed.size() - before;
}

}  // namespace dcr
