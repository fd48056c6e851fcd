// dcr/codec/choose.hpp: which encoding an item uses, and which location and value coding each of
// its streams uses.
//
// The rule (informative; docs/format.md, "Choosing codings", has the same text):
//   * Encoding (choose_encoding): overwrite when the policy is overwrite_only or the item may not
//     use a delta (retries, bit-changing loader paths); xor_mask for xor_only; ulp for ulp_only;
//     for mixed, the encoding whose value stream is estimated smallest, ties going to overwrite
//     (idempotent), then ulp, then xor_mask. Locations do not depend on the encoding.
//   * Codings (coding_planner, used by payload_encoder): every candidate coding gets a size
//     estimate from histograms of a deterministic sample of at most 1024 records (all of them in
//     smaller items): zstd's Huffman stage modelled on each byte-symbol section's histogram
//     (detail/huffman.hpp: information content per symbol, at least one bit, corrected for level
//     1's matches), plus the packed extra bits exactly. Value candidates: byte_planes,
//     zigzag_planes, buckets and zigzag_buckets (each bucket coding with its best M). Location
//     candidates: skip_buckets (best M); bitmap when there is at least one record per 16
//     elements up to the last; runs when there are at most half as many runs as records
//     (estimated from all runs). The smallest estimate wins, except that a coding within 1% of it
//     that is cheaper to write and read wins instead: byte planes before bucket sequences, runs
//     (also within 16 bytes) before other locations. Candidates are compressed and compared
//     exactly where that is cheap: the two best (and skip_varint) when the item's raw stream is
//     at most 256 bytes, the two best when their estimates are within 3% and the raw stream is
//     at most 4 KiB. codec_options::exact_choice compresses every candidate (every M, skip_varint
//     and raw too) instead.
//   * Sections (streams.hpp) of at least 128 bytes start a zstd block of their own, so byte
//     planes, symbols and extra bits each get their own Huffman table (or none, for extra bits).
// Every choice is a function of the item's bytes and the options: equal inputs give equal bytes.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/options.hpp"
#include "dcr/codec/streams.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detail/huffman.hpp"
#include "dcr/detail/zstd.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

namespace detail {

// The planner's work per item is bounded by these four figures. They were chosen by measuring
// owner construction and payload bytes (docs/benchmarks.md, "Pack and compress"): histograms of
// 1024 records estimate as well as of 8192 (payloads within 0.1%) at an eighth of the work, and
// compressing a second candidate pays only for streams too small to have a telling histogram.
/// Records a coding estimate looks at, at most (a deterministic, evenly strided sample) ...
inline constexpr std::size_t estimate_sample = 1024;
/// ... and records an encoding estimate (choose_encoding, three encodings) looks at.
inline constexpr std::size_t encoding_sample = 1024;
/// Raw streams at most this large have their two best candidates compressed exactly.
inline constexpr std::size_t exact_stream_bytes = 256;
/// Estimates closer than this (relative) cannot be told apart ...
inline constexpr double estimate_tie = 0.03;
/// ... and are compressed exactly when the raw stream is at most this large.
inline constexpr std::size_t exact_tie_bytes = 4096;
/// Sections shorter than this share a zstd block (and its Huffman table) with a neighbour.
inline constexpr std::size_t min_section_bytes = 128;

/// Calls f(position) for the sample of [0, n): all positions when n <= `limit`, else `limit`
/// evenly spaced ones (floor(i * n / limit)), found without a division per position.
template <class F>
void for_each_sampled(std::size_t n, std::size_t limit, F&& f);

/// Histogram of integer magnitudes fine enough to derive a bucket sequence's symbol histogram for
/// every M <= 4: values below 32 exactly, larger ones by bit length and the 4 bits below the
/// leading one.
struct magnitude_histogram {
  static constexpr std::size_t bins = 32 + 59 * 16;
  std::array<std::uint64_t, bins> counts{};
  std::uint64_t samples = 0;
  std::uint64_t largest = 0;  // OR of the values added: bounds the bins in use

  /// Counts `v` (in the header: called once per sampled record).
  void add(std::uint64_t v) noexcept {
    const auto len = static_cast<unsigned>(std::bit_width(v));
    const std::size_t key =
        v < 32 ? static_cast<std::size_t>(v)
               : 32 + ((len - 6) << 4) + static_cast<std::size_t>((v >> (len - 5)) & 15);
    ++counts[key];
    ++samples;
    largest |= v;
  }

  /// One past the highest bin in use.
  [[nodiscard]] std::size_t bins_used() const noexcept;

  /// Back to empty, zeroing only the bins in use (a histogram is reset per stream and item;
  /// zeroing all 976 bins cost more than filling the few in use).
  void clear() noexcept;

  /// Estimated compressed bytes of a bucket sequence of `total` integers with `m` (<= 4) mantissa
  /// bits, the sampled values standing for all of them.
  [[nodiscard]] double bucket_cost(unsigned m, std::uint64_t total) const noexcept;

  /// The M in [0, 4] of the smallest bucket_cost among those that carry `width` bits.
  [[nodiscard]] std::pair<unsigned, double> best_bucket(unsigned width,
                                                        std::uint64_t total) const noexcept;
};

/// One way to code a stream, with its estimated (or, once compressed, exact) size.
struct coding_candidate {
  std::uint8_t coding = 0;  ///< location_coding or value_coding value
  unsigned m = 0;           ///< bucket mantissa bits, where the coding has them
  double estimate = 0;
};

/// Sorts candidates by estimate, stable (earlier candidates win ties).
void rank(std::span<coding_candidate> c) noexcept;

/// Estimates closer than this (relative) to the best go to the coding cheapest to write and
/// read: byte planes before bucket sequences.
inline constexpr double prefer_cheaper = 0.01;

/// After rank(): moves to the front the candidate within prefer_cheaper of the best estimate
/// whose value coding is cheapest to produce (byte_planes, zigzag_planes, raw, then buckets).
void prefer_cheap_values(std::span<coding_candidate> c) noexcept;

/// After rank(): moves runs to the front when its estimate is within prefer_cheaper (or 16 bytes)
/// of the best: a few runs are the cheapest locations to read, and a whole changed tensor is one
/// run even where its bitmap (one repeated byte) compresses as small.
void prefer_runs(std::span<coding_candidate> c) noexcept;

/// Value statistics of one item's words: plane histograms (plain and zigzag), magnitude
/// histograms (plain and zigzag) over a sample, and the bit length of the largest word of each
/// kind over all words (which decides the bucket M that can carry them).
template <storage_word W>
struct value_stats {
  std::array<std::array<std::uint64_t, 256>, sizeof(W)> planes{}, zig_planes{};
  magnitude_histogram plain, zig;
  std::uint64_t count = 0;
  unsigned plain_width = 0, zig_width = 0;

  /// Which statistics measure() gathers (and candidates() may offer).
  enum kind : unsigned { plain_planes = 1, zig_planes_kind = 2, plain_buckets = 4, zig_buckets = 8,
                         all_kinds = 15 };
  unsigned kinds = all_kinds;

  void reset(unsigned what) noexcept;

  /// Measures `n` words `word(i)`, sampling at most `limit`, gathering the statistics `what`
  /// (kind bits); `all_widths` false takes the widths from the sample only (an estimate, for
  /// choosing between encodings).
  template <class Word>
  void measure(std::size_t n, Word&& word, std::size_t limit, bool all_widths,
               unsigned what = all_kinds) noexcept;

  [[nodiscard]] double planes_cost(bool zigzag) const noexcept;

  /// Candidates with estimates, among the kinds measured: byte_planes, zigzag_planes, buckets,
  /// zigzag_buckets (best M); `all_m` adds every other feasible M of the bucket codings,
  /// `with_raw` adds raw. Returns the number written to `out` (room for 16).
  std::size_t candidates(std::span<coding_candidate, 16> out, bool all_m, bool with_raw) const;

  std::uint64_t samples = 0;
};

/// Selects which section starts (offsets into a stream of `size` bytes) become zstd block
/// starts: sections shorter than min_section_bytes stay in the block of their neighbour.
std::size_t select_breaks(std::span<const std::size_t> sections, std::size_t size,
                          std::array<std::size_t, raw_stream::max_breaks>& kept) noexcept;

}  // namespace detail

/// What the planner chose for one stream.
struct stream_choice {
  std::uint8_t coding = 0;     ///< location_coding or value_coding value
  std::uint64_t raw_size = 0;  ///< bytes the stream's frame decompresses to
  /// The choice compared compressed candidates, and the winner's frame is in frame(); otherwise
  /// the winner's raw content is in raw(), to be compressed with compress().
  bool compressed = false;
};

/// A stream's choice and its frame's size.
struct stream_result {
  std::uint8_t coding = 0;       ///< location_coding or value_coding value
  std::uint64_t raw_size = 0;    ///< bytes the frame decompresses to
  std::uint64_t frame_size = 0;  ///< bytes of the zstd frame
};

/// Chooses the codings of item streams (the rule at the top of this header) and writes their raw
/// content, and compresses. Owns a zstd context and grow-only scratch; once warm (scratch grown
/// to the largest item seen) it allocates nothing. One per thread.
class coding_planner {
 public:
  /// A planner with `options`; invalid_argument for a zstd level outside zstd's range.
  explicit coding_planner(codec_options options = {})
      : options_(options), zstd_(options.zstd_level, options.zstd_hash_log) {}

  [[nodiscard]] const codec_options& options() const noexcept { return options_; }

  /// Room a frame of a location / value stream needs for an item of `count` records of
  /// `word_bytes`-byte words, whatever coding is chosen.
  [[nodiscard]] static std::size_t location_frame_bound(std::uint64_t count);
  [[nodiscard]] static std::size_t value_frame_bound(std::uint64_t count, std::size_t word_bytes);

  /// Chooses the location coding of strictly increasing `indices` (the caller has checked them)
  /// and leaves the winner in raw() or, when candidates were compared compressed, frame().
  stream_choice plan_locations(std::span<const std::uint64_t> indices) {
    return plan_locations(indices, detail::count_runs(indices));
  }
  /// plan_locations with `runs` = detail::count_runs(indices) already known (the encoder counts
  /// runs while it checks the indices).
  stream_choice plan_locations(std::span<const std::uint64_t> indices, std::size_t runs);

  /// Chooses the value coding of `n` words of type W (host order, at `words`) and leaves the
  /// winner in raw() or frame(), like plan_locations.
  template <storage_word W>
  stream_choice plan_values(const std::byte* words, std::size_t n);

  /// The raw content of the last plan's winner (when its choice is not `compressed`).
  [[nodiscard]] const detail::raw_stream& raw() const noexcept { return raw_; }
  /// The frame of the last plan's winner (when its choice is `compressed`).
  [[nodiscard]] std::span<const std::byte> frame() const noexcept {
    return {frame_.data(), frame_size_};
  }

  /// Compresses a raw stream into one zstd frame at the start of `dst`
  /// (detail::zstd_sections_bound(raw.size(), sections.size()) bytes): with adaptive options,
  /// sections of at least min_section_bytes start blocks of their own. Returns the frame's size.
  std::size_t compress(std::span<const std::byte> raw, std::span<const std::size_t> sections,
                       std::span<std::byte> dst);

  /// plan_locations, then the frame at the start of `dst` (location_frame_bound(count) bytes).
  stream_result encode_locations(std::span<const std::uint64_t> indices, std::span<std::byte> dst) {
    return emit(plan_locations(indices), dst);
  }
  /// plan_values, then the frame at the start of `dst` (value_frame_bound(n, sizeof(W)) bytes).
  template <storage_word W>
  stream_result encode_values(const std::byte* words, std::size_t n, std::span<std::byte> dst) {
    return emit(plan_values<W>(words, n), dst);
  }

  /// Estimated (or, with exact_choice, exact) bytes of the smallest value stream for the words
  /// `word(0..n)` of type W: what choose_encoding compares between encodings. `kinds` (a mask of
  /// detail::value_stats kinds) limits the estimated codings to those that suit the encoding.
  template <storage_word W, class Word>
  double value_stream_size(std::size_t n, Word&& word, unsigned kinds = 15);

 private:
  static void grow(std::vector<std::byte>& v, std::size_t n) {
    if (v.size() < n) v.resize(std::max(n, v.size() + v.size() / 2));
  }

  stream_result emit(const stream_choice& c, std::span<std::byte> dst);

  // How many of the ranked candidates to compress exactly: two when the raw stream is small or
  // the best two cannot be told apart, else one.
  static std::size_t exact_count(const std::array<detail::coding_candidate, 16>& c, std::size_t k,
                                 std::size_t raw_bytes) noexcept;

  // With one candidate: writes it (raw, not compressed). With several: writes and compresses
  // each, keeping the smallest frame (the earliest on ties) in frame_.
  template <class Write>
  stream_choice best_of(std::span<const detail::coding_candidate> c, std::size_t bound,
                        Write&& write);

  stream_choice write_location(location_coding coding, unsigned m,
                               std::span<const std::uint64_t> indices, std::size_t runs);

  template <storage_word W>
  detail::value_stats<W>& stats() {
    if constexpr (sizeof(W) == 1) return stats_->w1;
    else if constexpr (sizeof(W) == 2) return stats_->w2;
    else if constexpr (sizeof(W) == 4) return stats_->w4;
    else return stats_->w8;
  }

  struct all_stats {  // about 120 KiB: on the heap, once
    detail::value_stats<std::uint8_t> w1;
    detail::value_stats<std::uint16_t> w2;
    detail::value_stats<std::uint32_t> w4;
    detail::value_stats<std::uint64_t> w8;
  };

  codec_options options_;
  detail::zstd_compressor zstd_;
  detail::raw_stream raw_;
  detail::magnitude_histogram locations_;  // plan_locations' histogram, reused
  std::vector<std::byte> scratch_, run_scratch_;
  std::vector<std::byte> frame_, spare_;  // grow-only; frame_ holds frame_size_ bytes
  std::size_t frame_size_ = 0;
  std::vector<std::byte> words_;
  std::unique_ptr<all_stats> stats_ = std::make_unique<all_stats>();
};

namespace detail {
/// The planner choose_encoding uses on this thread, re-created when the options change.
coding_planner& thread_planner(const codec_options& options);
}  // namespace detail

/// The encoding of one item (the rule at the top of this header): overwrite when `policy` is
/// overwrite_only or `delta_permitted` is false; xor_mask for xor_only; ulp for ulp_only; for
/// mixed the encoding whose value stream would be smallest (estimated from a sample of the
/// records, or compressed exactly with options.exact_choice), ties to overwrite, then ulp.
/// `old_bits` and `new_bits` are the gathered words of the item's records (entry i belongs to
/// record i); invalid_argument when their lengths differ. Deterministic; allocates nothing once
/// this thread has seen an item as large (exact_choice) or at all (estimates).
template <storage_word W>
[[nodiscard]] encoding choose_encoding(encoding_policy policy, bool delta_permitted,
                                       std::span<const W> old_bits, std::span<const W> new_bits,
                                       const codec_options& options = {});

}  // namespace dcr

#include "dcr/detail/codec/choose.inl"
