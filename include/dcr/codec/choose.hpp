// dcr/codec/choose.hpp: which encoding an item uses, and which location and value coding each of
// its streams uses.
//
// The rule (informative; docs/format.md, "Choosing codings", has the same text):
//   * Encoding (choose_encoding): overwrite when the policy is overwrite_only or the item may not
//     use a delta (retries, bit-changing loader paths); xor_mask for xor_only; ulp for ulp_only;
//     for mixed, the encoding whose value stream is estimated smallest, ties going to overwrite
//     (idempotent), then ulp, then xor_mask. Locations do not depend on the encoding.
//   * Codings (coding_planner, used by payload_encoder): every candidate coding gets a size
//     estimate from histograms of a deterministic sample of at most 8192 records (all of them in
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
//     at most 4 KiB, the two best when their estimates are within 3% and the raw stream is at
//     most 64 KiB. codec_options::exact_choice compresses every candidate (every M, skip_varint
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

/// Records a coding estimate looks at, at most (a deterministic, evenly strided sample) ...
inline constexpr std::size_t estimate_sample = 8192;
/// ... and records an encoding estimate (choose_encoding, three encodings) looks at.
inline constexpr std::size_t encoding_sample = 4096;
/// Raw streams at most this large have their two best candidates compressed exactly.
inline constexpr std::size_t exact_stream_bytes = 4096;
/// Estimates closer than this (relative) cannot be told apart ...
inline constexpr double estimate_tie = 0.03;
/// ... and are compressed exactly when the raw stream is at most this large.
inline constexpr std::size_t exact_tie_bytes = 64u << 10;
/// Sections shorter than this share a zstd block (and its Huffman table) with a neighbour.
inline constexpr std::size_t min_section_bytes = 128;

/// Calls f(position) for the sample of [0, n): all positions when n <= `limit`, else `limit`
/// evenly spaced ones (floor(i * n / limit)), found without a division per position.
template <class F>
void for_each_sampled(std::size_t n, std::size_t limit, F&& f) {
  if (n <= limit) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  const std::size_t step = n / limit, rest = n % limit;
  std::size_t pos = 0, acc = 0;
  for (std::size_t i = 0; i < limit; ++i) {
    f(pos);
    pos += step;
    acc += rest;
    if (acc >= limit) {
      acc -= limit;
      ++pos;
    }
  }
}

/// Histogram of integer magnitudes fine enough to derive a bucket sequence's symbol histogram for
/// every M <= 4: values below 32 exactly, larger ones by bit length and the 4 bits below the
/// leading one.
struct magnitude_histogram {
  static constexpr std::size_t bins = 32 + 59 * 16;
  std::array<std::uint64_t, bins> counts{};
  std::uint64_t samples = 0;
  std::uint64_t largest = 0;  // OR of the values added: bounds the bins in use

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
  [[nodiscard]] std::size_t bins_used() const noexcept {
    const auto len = static_cast<unsigned>(std::bit_width(largest));
    return len <= 5 ? 32 : 32 + (len - 5) * 16;
  }

  /// Estimated compressed bytes of a bucket sequence of `total` integers with `m` (<= 4) mantissa
  /// bits, the sampled values standing for all of them.
  [[nodiscard]] double bucket_cost(unsigned m, std::uint64_t total) const noexcept {
    if (total == 0) return 1;
    if (samples == 0) return static_cast<double>(total);
    std::array<std::uint64_t, 256> symbols{};
    std::uint64_t extra = 0;
    const std::size_t used = bins_used();
    for (std::size_t k = 0; k < used; ++k) {
      const std::uint64_t c = counts[k];
      if (c == 0) continue;
      if (k < 32) {
        const bucket_code b = bucket_of(k, m);
        symbols[b.symbol] += c;
        extra += c * b.extra_bits;
      } else {
        const unsigned len = 6 + static_cast<unsigned>((k - 32) >> 4);
        const auto top4 = static_cast<unsigned>((k - 32) & 15);
        const unsigned symbol = (2u << m) + ((len - m - 2) << m) + (top4 >> (4 - m));
        symbols[std::min(symbol, 255u)] += c;
        extra += c * (len - 1 - m);
      }
    }
    const double scale = static_cast<double>(total) / static_cast<double>(samples);
    const double extra_bytes = static_cast<double>(extra) * scale / 8;
    return 1 + literal_cost(symbols, samples, total) + extra_bytes +
           3 * (extra_bytes / (128u << 10) + 1);
  }

  /// The M in [0, 4] of the smallest bucket_cost among those that carry `width` bits.
  [[nodiscard]] std::pair<unsigned, double> best_bucket(unsigned width,
                                                        std::uint64_t total) const noexcept {
    unsigned best_m = 0;
    double best = bucket_cost(0, total);
    for (unsigned m = 1; m <= bucket_max_mantissa; ++m) {
      if (bucket_max_width(m) < width) break;
      const double c = bucket_cost(m, total);
      if (c < best) {
        best = c;
        best_m = m;
      }
    }
    return {best_m, best};
  }
};

/// One way to code a stream, with its estimated (or, once compressed, exact) size.
struct coding_candidate {
  std::uint8_t coding = 0;  ///< location_coding or value_coding value
  unsigned m = 0;           ///< bucket mantissa bits, where the coding has them
  double estimate = 0;
};

/// Sorts candidates by estimate, stable (earlier candidates win ties).
inline void rank(std::span<coding_candidate> c) noexcept {
  for (std::size_t i = 1; i < c.size(); ++i)  // insertion sort: a dozen at most, no allocation
    for (std::size_t j = i; j > 0 && c[j].estimate < c[j - 1].estimate; --j)
      std::swap(c[j], c[j - 1]);
}

/// Estimates closer than this (relative) to the best go to the coding cheapest to write and
/// read: byte planes before bucket sequences.
inline constexpr double prefer_cheaper = 0.01;

/// After rank(): moves to the front the candidate within prefer_cheaper of the best estimate
/// whose value coding is cheapest to produce (byte_planes, zigzag_planes, raw, then buckets).
inline void prefer_cheap_values(std::span<coding_candidate> c) noexcept {
  if (c.size() < 2) return;
  const auto cost = [](std::uint8_t coding) {
    switch (static_cast<value_coding>(coding)) {
      case value_coding::byte_planes: return 0;
      case value_coding::zigzag_planes: return 1;
      case value_coding::raw: return 2;
      default: return 3;
    }
  };
  std::size_t pick = 0;
  for (std::size_t i = 1; i < c.size() && c[i].estimate <= c[0].estimate * (1 + prefer_cheaper); ++i)
    if (cost(c[i].coding) < cost(c[pick].coding)) pick = i;
  for (; pick > 0; --pick) std::swap(c[pick], c[pick - 1]);
}

/// After rank(): moves runs to the front when its estimate is within prefer_cheaper (or 16 bytes)
/// of the best: a few runs are the cheapest locations to read, and a whole changed tensor is one
/// run even where its bitmap (one repeated byte) compresses as small.
inline void prefer_runs(std::span<coding_candidate> c) noexcept {
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (c[i].coding != static_cast<std::uint8_t>(location_coding::runs)) continue;
    if (c[i].estimate <= std::max(c[0].estimate * (1 + prefer_cheaper), c[0].estimate + 16))
      for (std::size_t j = i; j > 0; --j) std::swap(c[j], c[j - 1]);
    return;
  }
}

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

  void reset(unsigned what) noexcept {
    if (what & plain_planes)
      for (auto& p : planes) p.fill(0);
    if (what & zig_planes_kind)
      for (auto& p : zig_planes) p.fill(0);
    if (what & plain_buckets) plain = {};
    if (what & zig_buckets) zig = {};
    kinds = what;
    count = 0;
    plain_width = zig_width = 0;
  }

  /// Measures `n` words `word(i)`, sampling at most `limit`, gathering the statistics `what`
  /// (kind bits); `all_widths` false takes the widths from the sample only (an estimate, for
  /// choosing between encodings).
  template <class Word>
  void measure(std::size_t n, Word&& word, std::size_t limit, bool all_widths,
               unsigned what = all_kinds) noexcept {
    reset(what);
    count = n;
    W or_plain = 0, or_zig = 0;
    std::uint64_t sampled = 0;
    for_each_sampled(n, limit, [&](std::size_t i) {
      const W w = word(i);
      const W z = zigzag_encode<W>(w);
      if (what & plain_planes)
        for (std::size_t k = 0; k < sizeof(W); ++k) ++planes[k][static_cast<std::uint8_t>(w >> (8 * k))];
      if (what & zig_planes_kind)
        for (std::size_t k = 0; k < sizeof(W); ++k) ++zig_planes[k][static_cast<std::uint8_t>(z >> (8 * k))];
      if (what & plain_buckets) plain.add(w);
      if (what & zig_buckets) zig.add(z);
      or_plain |= w;
      or_zig |= z;
      ++sampled;
    });
    samples = sampled;
    // The widths decide which M can carry the words; for 1- and 2-byte words every M up to
    // bucket_max_mantissa can, so only wider words need the pass over all of them.
    if constexpr (sizeof(W) <= 2) {
      or_plain = or_zig = static_cast<W>(~W{0});
    } else if (all_widths && n > limit) {
      for (std::size_t i = 0; i < n; ++i) {
        const W w = word(i);
        or_plain |= w;
        or_zig |= zigzag_encode<W>(w);
      }
    }
    plain_width = static_cast<unsigned>(std::bit_width(or_plain));
    zig_width = static_cast<unsigned>(std::bit_width(or_zig));
  }

  [[nodiscard]] double planes_cost(bool zigzag) const noexcept {
    double c = 0;
    for (std::size_t k = 0; k < sizeof(W); ++k)
      c += literal_cost(zigzag ? zig_planes[k] : planes[k], samples, count);
    return c;
  }

  /// Candidates with estimates, among the kinds measured: byte_planes, zigzag_planes, buckets,
  /// zigzag_buckets (best M); `all_m` adds every other feasible M of the bucket codings,
  /// `with_raw` adds raw. Returns the number written to `out` (room for 16).
  std::size_t candidates(std::span<coding_candidate, 16> out, bool all_m, bool with_raw) const {
    std::size_t n = 0;
    const auto add = [&](value_coding c, unsigned m, double e) {
      out[n++] = {static_cast<std::uint8_t>(c), m, e};
    };
    if (kinds & plain_planes) add(value_coding::byte_planes, 0, planes_cost(false));
    if (kinds & zig_planes_kind) add(value_coding::zigzag_planes, 0, planes_cost(true));
    for (const bool z : {false, true}) {
      if (!(kinds & (z ? zig_buckets : plain_buckets))) continue;
      const magnitude_histogram& h = z ? zig : plain;
      const unsigned width = z ? zig_width : plain_width;
      const value_coding c = z ? value_coding::zigzag_buckets : value_coding::buckets;
      const auto [m, e] = h.best_bucket(width, count);
      add(c, m, e);
      if (all_m)
        for (unsigned k = 0; k <= bucket_max_mantissa && bucket_max_width(k) >= width; ++k)
          if (k != m) add(c, k, h.bucket_cost(k, count));
    }
    if (with_raw) add(value_coding::raw, 0, static_cast<double>(count * sizeof(W)) + 16);
    return n;
  }

  std::uint64_t samples = 0;
};

/// Selects which section starts (offsets into a stream of `size` bytes) become zstd block
/// starts: sections shorter than min_section_bytes stay in the block of their neighbour.
inline std::size_t select_breaks(std::span<const std::size_t> sections, std::size_t size,
                                 std::array<std::size_t, raw_stream::max_breaks>& kept) noexcept {
  std::size_t n = 0, from = 0;
  for (std::size_t k = 0; k < sections.size(); ++k) {
    const std::size_t next = k + 1 < sections.size() ? sections[k + 1] : size;
    if (sections[k] - from >= min_section_bytes && next - sections[k] >= min_section_bytes) {
      kept[n++] = sections[k];
      from = sections[k];
    }
  }
  return n;
}

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
  [[nodiscard]] static std::size_t location_frame_bound(std::uint64_t count) {
    return detail::zstd_sections_bound(static_cast<std::size_t>(detail::location_raw_bound(count)),
                                       detail::raw_stream::max_breaks);
  }
  [[nodiscard]] static std::size_t value_frame_bound(std::uint64_t count, std::size_t word_bytes) {
    return detail::zstd_sections_bound(
        static_cast<std::size_t>(detail::value_raw_bound(count, word_bytes)),
        detail::raw_stream::max_breaks);
  }

  /// Chooses the location coding of strictly increasing `indices` (the caller has checked them)
  /// and leaves the winner in raw() or, when candidates were compared compressed, frame().
  stream_choice plan_locations(std::span<const std::uint64_t> indices) {
    return plan_locations(indices, detail::count_runs(indices));
  }
  /// plan_locations with `runs` = detail::count_runs(indices) already known (the encoder counts
  /// runs while it checks the indices).
  stream_choice plan_locations(std::span<const std::uint64_t> indices, std::size_t runs) {
    using detail::coding_candidate;
    const std::size_t n = indices.size();
    if (!options_.adaptive || n == 0) return write_location(location_coding::skip_varint, 0, indices, 0);

    const auto width = static_cast<unsigned>(std::bit_width(indices.back()));
    std::array<coding_candidate, 16> c{};
    std::size_t k = 0;
    const bool exact = options_.exact_choice;
    const bool small = n + 16 <= detail::exact_stream_bytes;
    const auto forced = options_.location;
    const bool bitmap_ok = detail::bitmap_eligible(indices);
    const bool runs_ok = detail::runs_eligible(n, runs);
    const auto allowed = [&](location_coding x) {
      if (!forced || *forced == x) return true;
      // A forced coding the item does not suit falls back to the usual choice.
      return (*forced == location_coding::bitmap && !bitmap_ok) ||
             (*forced == location_coding::runs && !runs_ok);
    };
    const auto code = [](location_coding x) { return static_cast<std::uint8_t>(x); };

    if (allowed(location_coding::skip_buckets)) {
      detail::magnitude_histogram h;
      detail::for_each_sampled(n, detail::estimate_sample, [&](std::size_t j) {
        h.add(j == 0 ? indices[0] : indices[j] - indices[j - 1] - 1);
      });
      const auto [m, e] = h.best_bucket(width, n);
      c[k++] = {code(location_coding::skip_buckets), m, e};
      if (exact)
        for (unsigned x = 0; x <= detail::bucket_max_mantissa && detail::bucket_max_width(x) >= width; ++x)
          if (x != m) c[k++] = {code(location_coding::skip_buckets), x, h.bucket_cost(x, n)};
    }
    if (bitmap_ok && allowed(location_coding::bitmap)) {
      detail::write_locations(raw_, scratch_, run_scratch_, indices, location_coding::bitmap, 0, 0);
      std::array<std::uint64_t, 256> hist{};
      for (const std::byte b : raw_.bytes()) ++hist[std::to_integer<std::uint8_t>(b)];
      c[k++] = {code(location_coding::bitmap), 0,
                detail::literal_cost(hist, raw_.size, raw_.size)};
    }
    if (runs_ok && allowed(location_coding::runs)) {
      detail::magnitude_histogram h;
      std::uint64_t next = 0;
      for (std::size_t j = 0; j < n;) {
        std::size_t e = j + 1;
        while (e < n && indices[e] == indices[e - 1] + 1) ++e;
        h.add(indices[j] - next);
        h.add(e - j - 1);
        next = indices[e - 1] + 1;
        j = e;
      }
      const auto [m, e] = h.best_bucket(width, 2 * runs);
      c[k++] = {code(location_coding::runs), m,
                e + static_cast<double>(detail::varint_size(runs))};
    }
    // skip_varint has no estimate: it is compressed where candidates are compared exactly (or
    // when forced), and never chosen by estimate.
    const bool varint = (exact || small || forced == location_coding::skip_varint) &&
                        allowed(location_coding::skip_varint);
    detail::rank(std::span<coding_candidate>(c.data(), k));
    if (!exact) detail::prefer_runs(std::span<coding_candidate>(c.data(), k));
    std::size_t tries = exact ? k : exact_count(c, k, n + 16);
    if (varint) c[tries++] = {code(location_coding::skip_varint), 0, 0};

    return best_of(std::span<const coding_candidate>(c.data(), tries),
                   location_frame_bound(n), [&](const coding_candidate& x) {
                     return write_location(static_cast<location_coding>(x.coding), x.m, indices, runs);
                   });
  }

  /// Chooses the value coding of `n` words of type W (host order, at `words`) and leaves the
  /// winner in raw() or frame(), like plan_locations.
  template <storage_word W>
  stream_choice plan_values(const std::byte* words, std::size_t n) {
    using detail::coding_candidate;
    if (!options_.adaptive) {
      const auto coding = options_.byte_planes ? value_coding::byte_planes : value_coding::raw;
      detail::write_values<W>(raw_, scratch_, words, n, coding, 0, 0);
      raw_.break_count = 0;  // one zstd call per stream, as the first release did
      return {static_cast<std::uint8_t>(coding), raw_.size, false};
    }
    const auto word = [&](std::size_t i) {
      W w;
      std::memcpy(&w, words + i * sizeof(W), sizeof(W));
      return w;
    };
    detail::value_stats<W>& st = stats<W>();
    st.measure(n, word, detail::estimate_sample, true);
    const bool exact = options_.exact_choice;
    const std::size_t raw_bytes = n * sizeof(W);
    std::array<coding_candidate, 16> all{};
    std::size_t k = st.candidates(all, exact, exact);
    if (options_.value) {  // keep only the forced coding's candidates
      std::size_t kept = 0;
      for (std::size_t i = 0; i < k; ++i)
        if (all[i].coding == static_cast<std::uint8_t>(*options_.value)) all[kept++] = all[i];
      if (kept == 0) all[kept++] = {static_cast<std::uint8_t>(*options_.value), 0, 0};
      k = kept;
    }
    detail::rank(std::span<coding_candidate>(all.data(), k));
    if (!exact) detail::prefer_cheap_values(std::span<coding_candidate>(all.data(), k));
    const unsigned plain_width = st.plain_width, zig_width = st.zig_width;
    return best_of(std::span<const coding_candidate>(all.data(), exact ? k : exact_count(all, k, raw_bytes)),
                   value_frame_bound(n, sizeof(W)), [&](const coding_candidate& x) {
                     const auto coding = static_cast<value_coding>(x.coding);
                     detail::write_values<W>(raw_, scratch_, words, n, coding, x.m,
                                             detail::is_zigzag_coding(coding) ? zig_width
                                                                              : plain_width);
                     return stream_choice{x.coding, raw_.size, false};
                   });
  }

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
                       std::span<std::byte> dst) {
    std::array<std::size_t, detail::raw_stream::max_breaks> kept{};
    const std::size_t nk =
        options_.adaptive ? detail::select_breaks(sections, raw.size(), kept) : 0;
    return zstd_.compress(raw, std::span<const std::size_t>(kept.data(), nk), dst);
  }

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
  double value_stream_size(std::size_t n, Word&& word, unsigned kinds = 15) {
    if (options_.exact_choice) {
      if (words_.size() < n * sizeof(W)) words_.resize(n * sizeof(W));
      for (std::size_t i = 0; i < n; ++i) {
        const W w = word(i);
        std::memcpy(words_.data() + i * sizeof(W), &w, sizeof(W));
      }
      const stream_choice c = plan_values<W>(words_.data(), n);
      if (c.compressed) return static_cast<double>(frame_size_);
      grow(frame_, value_frame_bound(n, sizeof(W)));
      frame_size_ = compress(raw_.bytes(), raw_.sections(), frame_);
      return static_cast<double>(frame_size_);
    }
    detail::value_stats<W>& st = stats<W>();
    st.measure(n, word, detail::encoding_sample, false, kinds);
    std::array<detail::coding_candidate, 16> all{};
    const std::size_t k = st.candidates(all, false, false);
    double best = all[0].estimate;
    for (std::size_t i = 1; i < k; ++i) best = std::min(best, all[i].estimate);
    return best;
  }

 private:
  static void grow(std::vector<std::byte>& v, std::size_t n) {
    if (v.size() < n) v.resize(std::max(n, v.size() + v.size() / 2));
  }

  stream_result emit(const stream_choice& c, std::span<std::byte> dst) {
    if (c.compressed) {
      std::memcpy(dst.data(), frame_.data(), frame_size_);
      return {c.coding, c.raw_size, frame_size_};
    }
    return {c.coding, c.raw_size, compress(raw_.bytes(), raw_.sections(), dst)};
  }

  // How many of the ranked candidates to compress exactly: two when the raw stream is small or
  // the best two cannot be told apart, else one.
  static std::size_t exact_count(const std::array<detail::coding_candidate, 16>& c, std::size_t k,
                                 std::size_t raw_bytes) noexcept {
    if (k <= 1) return k;
    if (raw_bytes <= detail::exact_stream_bytes) return std::min<std::size_t>(k, 2);
    if (raw_bytes <= detail::exact_tie_bytes &&
        c[1].estimate <= c[0].estimate * (1 + detail::estimate_tie))
      return 2;
    return 1;
  }

  // With one candidate: writes it (raw, not compressed). With several: writes and compresses
  // each, keeping the smallest frame (the earliest on ties) in frame_.
  template <class Write>
  stream_choice best_of(std::span<const detail::coding_candidate> c, std::size_t bound,
                        Write&& write) {
    if (c.size() == 1) return write(c[0]);
    grow(frame_, bound);
    grow(spare_, bound);
    stream_choice best{};
    for (std::size_t i = 0; i < c.size(); ++i) {
      stream_choice r = write(c[i]);
      const std::size_t size = compress(raw_.bytes(), raw_.sections(), spare_);
      if (i == 0 || size < frame_size_) {
        frame_.swap(spare_);
        frame_size_ = size;
        best = r;
      }
    }
    best.compressed = true;
    return best;
  }

  stream_choice write_location(location_coding coding, unsigned m,
                               std::span<const std::uint64_t> indices, std::size_t runs) {
    detail::write_locations(raw_, scratch_, run_scratch_, indices, coding, m, runs);
    return {static_cast<std::uint8_t>(coding), raw_.size, false};
  }

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
  std::vector<std::byte> scratch_, run_scratch_;
  std::vector<std::byte> frame_, spare_;  // grow-only; frame_ holds frame_size_ bytes
  std::size_t frame_size_ = 0;
  std::vector<std::byte> words_;
  std::unique_ptr<all_stats> stats_ = std::make_unique<all_stats>();
};

namespace detail {
/// The planner choose_encoding uses on this thread, re-created when the options change.
inline coding_planner& thread_planner(const codec_options& options) {
  thread_local coding_planner planner(options);
  const codec_options& o = planner.options();
  if (o.zstd_level != options.zstd_level || o.zstd_hash_log != options.zstd_hash_log ||
      o.adaptive != options.adaptive ||
      o.exact_choice != options.exact_choice || o.byte_planes != options.byte_planes ||
      o.location != options.location || o.value != options.value)
    planner = coding_planner(options);
  return planner;
}
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
                                       const codec_options& options = {}) {
  DCR_EXPECTS(old_bits.size() == new_bits.size(), errc::invalid_argument,
              "choose_encoding: " + std::to_string(old_bits.size()) + " old and " +
                  std::to_string(new_bits.size()) + " new words");
  if (policy == encoding_policy::overwrite_only || !delta_permitted) return encoding::overwrite;
  if (policy == encoding_policy::xor_only) return encoding::xor_mask;
  if (policy == encoding_policy::ulp_only) return encoding::ulp;
  if (old_bits.empty()) return encoding::overwrite;
  coding_planner& planner = detail::thread_planner(options);
  encoding best = encoding::overwrite;
  double best_size = 0;
  bool first = true;
  // Each encoding is estimated with the codings that suit its values: new bits as byte planes
  // (float bits have no small magnitude), xor masks as byte planes or unsigned buckets, ulp
  // deltas zigzag-mapped.
  using stats = detail::value_stats<W>;
  for (const encoding e : {encoding::overwrite, encoding::ulp, encoding::xor_mask}) {
    const unsigned kinds = e == encoding::overwrite ? stats::plain_planes
                           : e == encoding::ulp     ? stats::zig_planes_kind | stats::zig_buckets
                                                    : stats::plain_planes | stats::plain_buckets;
    const double size = visit_encoding(e, [&](auto enc) {
      using E = decltype(enc);
      return planner.value_stream_size<W>(
          old_bits.size(), [&](std::size_t i) { return E::encode(old_bits[i], new_bits[i]); },
          kinds);
    });
    if (first || size < best_size) {
      best = e;
      best_size = size;
      first = false;
    }
  }
  return best;
}

}  // namespace dcr
