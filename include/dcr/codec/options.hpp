// dcr/codec/options.hpp: the payload's stream codings and the encoder's settings.
//
// An item's two streams (locations and values) each use one coding, recorded by its code in the
// item table. The codes are part of the payload format (docs/format.md); the encoder picks one per
// item and stream, the decoder reads any of them.
#pragma once

#include <cstdint>
#include <optional>

namespace dcr {

/// How an item's location stream codes its indices. Numeric values are part of the format.
enum class location_coding : std::uint8_t {
  /// LEB128 varints, one per record: the number of elements skipped since the previous record
  /// (index - previous index - 1; the first record's is its index).
  skip_varint = 0,
  /// The same skips as a bucket sequence: per record a one-byte symbol (bit length and leading
  /// bits of the skip) and, packed apart, the skip's remaining low bits.
  skip_buckets = 1,
  /// One bit per element, set for the records, up to the byte holding the last record.
  bitmap = 2,
  /// Maximal runs of consecutive indices: the run count, then the skip before each run and each
  /// run's length minus one as a bucket sequence.
  runs = 3,
};

/// How an item's value stream lays out its words. Numeric values are part of the format.
enum class value_coding : std::uint8_t {
  raw = 0,            ///< the words, little-endian, one after another
  byte_planes = 1,    ///< byte k of every word, for k = 0 (least significant) up
  zigzag_planes = 2,  ///< byte planes of the zigzag-mapped words (small signed values: high 0)
  buckets = 3,        ///< the words as a bucket sequence (unsigned magnitudes)
  zigzag_buckets = 4, ///< the zigzag-mapped words as a bucket sequence (small signed values)
};

/// Encoder settings. None changes what a decoder reads back, only the bytes in between.
struct codec_options {
  /// zstd level of every stream (ZSTD_minCLevel()..ZSTD_maxCLevel()).
  int zstd_level = 1;
  /// log2 of zstd's match-finder hash table (ZSTD_c_hashLog) for every stream; 0 keeps the
  /// level's own. The codings leave streams of literals with few long repeats: a small table
  /// makes zstd faster and keeps it from taking short matches that cost more than the literals
  /// they replace (about 8% smaller value streams than level 1's own 2^14-entry table).
  int zstd_hash_log = 6;
  /// With adaptive == false: value coding byte_planes (compresses better) instead of raw.
  bool byte_planes = true;
  /// Choose each item's location and value coding by size (docs/format.md, "Choosing codings").
  /// false: every item uses the codings a version-1 decoder of the first release reads
  /// (skip_varint, and byte_planes or raw per `byte_planes`), each stream compressed in one call.
  bool adaptive = true;
  /// With adaptive: compress every candidate coding (and, in choose_encoding, every encoding) and
  /// keep the smallest, instead of estimating. Smallest payloads; several times the compression
  /// work.
  bool exact_choice = false;
  /// With adaptive: use this location coding for every item it suits (bitmap: at least one
  /// record per 16 elements up to the last; runs: at most one run per two records), the usual
  /// choice elsewhere. For tests and for producing payloads of a given shape.
  std::optional<location_coding> location{};
  /// With adaptive: use this value coding for every item (the bucket parameter still chosen).
  std::optional<value_coding> value{};
};

}  // namespace dcr
