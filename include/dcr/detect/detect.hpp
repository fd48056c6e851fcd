// dcr/detect/detect.hpp: change detection, bit by bit.
//
// An owner compares its candidate shard with its tracker (the committed version-v words) and
// collects the local indices whose stored words differ. Comparison is always on stored bits:
// float equality would call -0 and +0 equal and every NaN unequal, and would miss or invent
// changes. The per-element predicate `bits_differ` is shared with the CUDA kernels.
#pragma once

#include <algorithm>
#include <concepts>
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

namespace detail {

/// The detect loop: for each chunk of the two arrays with changed words, calls
/// emit(k, base, offsets): the chunk's k changed words sit at local indices base + offsets[q]
/// (q < k, increasing), and the chunk's words were just read (they are in cache). Allocates
/// nothing (the offsets live on the stack).
template <storage_word W, class Emit>
void for_each_detected_chunk(const W* a, const W* b, std::size_t n, Emit&& emit);

}  // namespace detail

/// Appends to `changed`, in increasing order, `first_index + j` for every j where the stored
/// words tracker[j] and candidate[j] differ. Both spans must have the same length
/// (shape_mismatch, nothing appended, otherwise). Returns the number of indices appended. Runs
/// near memory bandwidth on one core: each 64-byte block costs one or two SIMD compares
/// (AVX-512 or AVX2, chosen at run time; a portable loop elsewhere), and changed words are
/// compacted as 16-bit offsets in a small on-stack buffer, then widened, so `changed` grows only
/// by what is found.
template <storage_word W>
std::size_t detect_changes(std::span<const W> tracker, std::span<const W> candidate,
                           std::vector<std::uint64_t>& changed, std::uint64_t first_index = 0);

namespace detail {

// Room for `k` more words at the end of a vector of words or of bytes holding words.
template <storage_word W>
W* append_words(std::vector<W>& v, std::size_t k) {
  const std::size_t at = v.size();
  v.resize(at + k);
  return v.data() + at;
}
template <storage_word W>
W* append_words(std::vector<std::byte>& v, std::size_t k) {
  const std::size_t at = v.size();
  v.resize(at + k * sizeof(W));
  return reinterpret_cast<W*>(v.data() + at);
}

/// The one-pass detect + gather loop: for each chunk of the two arrays with changed words, calls
/// emit(k, base, offsets, old_stage, new_stage): the chunk's k changed words sit at local
/// indices base + offsets[q] (q < k, increasing), their words in the two stages. Allocates
/// nothing (the stages live on the stack, about 50 KiB).
template <storage_word W, class Emit>
void for_each_changed_chunk(const W* a, const W* b, std::size_t n, Emit&& emit);

/// detect_and_gather (below) without its constraint on the word vectors.
template <storage_word W, class OldWords, class NewWords>
std::size_t detect_and_gather_into(std::span<const W> tracker, std::span<const W> candidate,
                                   std::vector<std::uint64_t>& changed, OldWords& old_words,
                                   NewWords& new_words, std::uint64_t first_index);

/// detect_and_gather into caller arrays of capacity n (no allocation): index[k], old_words[k],
/// new_words[k] for the k-th changed word (either word array may be null). Returns the count.
/// Runs the detect loop and picks the words of each chunk's changes up while the chunk is still
/// in cache: at low change rates this is faster than compacting the words in registers.
template <storage_word W>
std::size_t detect_and_gather_to(const W* tracker, const W* candidate, std::size_t n,
                                 std::uint64_t* index, W* old_words, W* new_words,
                                 std::uint64_t first_index) noexcept;

}  // namespace detail

/// A vector that can receive gathered words of type W: std::vector<W>, or std::vector<std::byte>
/// holding them in host byte order (the layout of item::values).
template <class V, class W>
concept gathered_words =
    std::same_as<V, std::vector<W>> || std::same_as<V, std::vector<std::byte>>;

/// detect_changes that also gathers the differing words, in one pass over the data: appends the
/// indices to `changed` exactly as detect_changes does, and tracker[j] and candidate[j] of each
/// to `old_words` and `new_words` (each a std::vector<W> or a std::vector<std::byte>, which
/// grows by sizeof(W) bytes a record), so that entry i of what each of the three gained belongs
/// to the same record: what choose_encoding takes, and what an item's values are computed from.
/// Returns the number of records appended; shape_mismatch (nothing appended) when the spans
/// differ in length. Same speed class as detect_changes: the words are compacted in registers
/// with the offsets (AVX-512), or picked up by the loop that emits each offset (elsewhere),
/// while the block is still loaded. Allocates only to grow the three vectors.
template <storage_word W, class OldWords, class NewWords>
  requires gathered_words<OldWords, W> && gathered_words<NewWords, W>
std::size_t detect_and_gather(std::span<const W> tracker, std::span<const W> candidate,
                              std::vector<std::uint64_t>& changed, OldWords& old_words,
                              NewWords& new_words, std::uint64_t first_index = 0) {
  return detail::detect_and_gather_into<W>(tracker, candidate, changed, old_words, new_words,
                                           first_index);
}

}  // namespace dcr

#include "dcr/detail/detect/detect.inl"
