// dcr/codec/payload.hpp: the payload codec, format version 1 (normative spec: docs/format.md).
//
// A payload packs one owner's items for one attempt of one transition: a fixed 80-byte header, a
// table of 64-byte item entries, per item a location stream and a value stream (each one standard
// zstd frame), and an XXH3-64 checksum of everything before it. Everything is little-endian.
//
// The encoder and decoder own their zstd contexts and scratch and reuse them across calls: once
// warm (buffers grown to the largest payload seen), encoding and decoding allocate nothing. The
// decoder validates the whole payload (checksum, header, every entry against the registry, every
// frame, every index) before returning, and never sizes a buffer from a field it has not bounded
// by the payload's size and the registry's tensor sizes.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/detail/zstd.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// Encoder settings. Neither changes what a decoder reads back, only the bytes in between.
struct codec_options {
  int zstd_level = 1;       ///< zstd level of every stream (ZSTD_minCLevel()..ZSTD_maxCLevel())
  bool byte_planes = true;  ///< value coding byte_planes (compresses better) instead of raw
};

/// Constants of payload format version 1 (docs/format.md).
namespace payload_format {
inline constexpr std::uint32_t magic = 0x50524344u;  ///< "DCRP" read as a little-endian u32
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_size = 80;
inline constexpr std::size_t entry_size = 64;
inline constexpr std::size_t trailer_size = 8;  ///< the XXH3-64 checksum
}  // namespace payload_format

/// How an item's location stream codes its indices. Numeric values are part of the format.
enum class location_coding : std::uint8_t {
  /// LEB128 varints, one per record: the number of elements skipped since the previous record
  /// (index - previous index - 1; the first record's is its index).
  skip_varint = 0,
};

/// How an item's value stream lays out its words. Numeric values are part of the format.
enum class value_coding : std::uint8_t {
  raw = 0,          ///< the words, little-endian, one after another
  byte_planes = 1,  ///< byte k of every word, for k = 0 (least significant) up
};

/// What a receiver expects: a payload of another transition or attempt is stale.
struct transition_filter {
  std::uint64_t base_version;
  std::uint64_t target_version;
  std::uint32_t attempt;
};

/// One item table entry, as stored. Codes are raw bytes because the table is readable before
/// they are checked against what this decoder supports.
struct item_entry {
  tensor_id tensor = 0;
  std::uint8_t dtype_code = 0;          ///< dcr::dtype value
  std::uint8_t encoding_code = 0;       ///< dcr::encoding value
  std::uint8_t location_code = 0;       ///< dcr::location_coding value
  std::uint8_t value_code = 0;          ///< dcr::value_coding value
  std::uint64_t count = 0;              ///< records
  std::uint64_t numel = 0;              ///< elements of the canonical tensor
  std::uint64_t location_size = 0;      ///< bytes of the location frame in the payload
  std::uint64_t location_raw_size = 0;  ///< bytes it decompresses to
  std::uint64_t value_size = 0;
  std::uint64_t value_raw_size = 0;
  std::uint64_t location_offset = 0;  ///< payload offset of the location frame (derived)
  std::uint64_t value_offset = 0;     ///< payload offset of the value frame (derived)
};

namespace detail {

// Writes the words (host order) as little-endian words or as byte planes; and back.
template <storage_word W>
inline void words_to_le(const std::byte* words, std::size_t n, std::byte* out) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(out, words, n * sizeof(W));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      W w;
      std::memcpy(&w, words + i * sizeof(W), sizeof(W));
      store_le<W>(out + i * sizeof(W), w);
    }
  }
}
template <storage_word W>
inline void le_to_words(const std::byte* in, std::size_t n, std::byte* words) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(words, in, n * sizeof(W));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const W w = load_le<W>(in + i * sizeof(W));
      std::memcpy(words + i * sizeof(W), &w, sizeof(W));
    }
  }
}
template <storage_word W>
inline void split_byte_planes(const std::byte* words, std::size_t n, std::byte* planes) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    W w;
    std::memcpy(&w, words + i * sizeof(W), sizeof(W));
    for (std::size_t k = 0; k < sizeof(W); ++k)
      planes[k * n + i] = static_cast<std::byte>(w >> (8 * k));
  }
}
template <storage_word W>
inline void join_byte_planes(const std::byte* planes, std::size_t n, std::byte* words) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    W w = 0;
    for (std::size_t k = 0; k < sizeof(W); ++k)
      w = static_cast<W>(w | std::to_integer<W>(planes[k * n + i]) << (8 * k));
    std::memcpy(words + i * sizeof(W), &w, sizeof(W));
  }
}

// Upper bound of a location stream's raw size: each skip is at most the largest index.
constexpr std::uint64_t max_location_raw_size(std::uint64_t count, std::uint64_t numel) noexcept {
  return count * varint_size(numel == 0 ? 0 : numel - 1);
}

inline std::string entry_where(std::size_t i, tensor_id tensor, const tensor_registry* registry) {
  std::string s = "item " + std::to_string(i) + " (tensor id " + std::to_string(tensor);
  if (registry != nullptr && tensor < registry->size())
    s += " '" + registry->tensors()[tensor].name + "'";
  return s + ", entry at byte " +
         std::to_string(payload_format::header_size + i * payload_format::entry_size) + ")";
}

}  // namespace detail

/// Encodes items into payloads. Owns a zstd context and scratch reused by every call; one per
/// thread.
class payload_encoder {
 public:
  /// An encoder with `options`; invalid_argument for a zstd level outside zstd's range.
  explicit payload_encoder(codec_options options = {})
      : options_(options), zstd_(options.zstd_level) {}

  [[nodiscard]] const codec_options& options() const noexcept { return options_; }

  /// An upper bound of the size encode() writes for `items`, under any options. O(items).
  [[nodiscard]] static std::size_t max_encoded_size(std::span<const item> items) {
    std::size_t n = payload_format::header_size + items.size() * payload_format::entry_size +
                    payload_format::trailer_size;
    for (const item& it : items) {
      const std::uint64_t last = it.indices.empty() ? 0 : it.indices.back();
      n += detail::zstd_compress_bound(it.count() * detail::varint_size(last));
      n += detail::zstd_compress_bound(it.count() * it.word_bytes());
    }
    return n;
  }

  /// Overwrites `out` with the payload of `items` under `header`, in item order. `registry` is
  /// the model the items address: each item's tensor must be in it with the item's dtype, and its
  /// indices must be strictly increasing and below the tensor's numel; values.size() must be
  /// count() * word_bytes(); the encoding overwrite or xor_mask; no two items may name one
  /// tensor; header.registry_fingerprint must equal registry.fingerprint(). Violations throw
  /// (invalid_argument, or unknown_tensor / dtype_mismatch / out_of_range for the tensor checks)
  /// before `out` is touched. For a given zstd library version and options, equal inputs give
  /// equal bytes. Allocates only to grow `out` and the scratch beyond sizes seen before.
  void encode(const payload_header& header, std::span<const item> items,
              const tensor_registry& registry, std::vector<std::byte>& out) {
    DCR_EXPECTS(header.registry_fingerprint == registry.fingerprint(), errc::invalid_argument,
                "payload_encoder: header registry fingerprint differs from the registry's");
    DCR_EXPECTS(items.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "payload_encoder: " + std::to_string(items.size()) + " items exceed 2^32 - 1");

    // Pass 1: check every item and size every stream, before writing anything.
    location_sizes_.resize(items.size());
    ids_.resize(items.size());
    std::size_t bound = payload_format::header_size + items.size() * payload_format::entry_size +
                        payload_format::trailer_size;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const item& it = items[i];
      const auto where = [&] {
        return "payload_encoder: " + detail::entry_where(i, it.tensor, &registry);
      };
      DCR_EXPECTS(it.tensor < registry.size(), errc::unknown_tensor, where() + ": unknown tensor");
      const canonical_tensor& t = registry.tensors()[it.tensor];
      DCR_EXPECTS(it.type == t.type, errc::dtype_mismatch,
                  where() + ": dtype " + std::string(dtype_name(it.type)) + ", registry has " +
                      std::string(dtype_name(t.type)));
      DCR_EXPECTS(is_supported_encoding(it.enc), errc::invalid_argument,
                  where() + ": encoding " + std::to_string(static_cast<int>(it.enc)) +
                      " is not in format version 1");
      DCR_EXPECTS(it.values.size() == it.count() * it.word_bytes(), errc::invalid_argument,
                  where() + ": " + std::to_string(it.values.size()) + " value bytes for " +
                      std::to_string(it.count()) + " records");
      const auto numel = static_cast<std::uint64_t>(t.numel());
      std::uint64_t next = 0;  // the smallest index the next record may have
      std::uint64_t raw = 0;
      for (std::size_t j = 0; j < it.indices.size(); ++j) {
        const std::uint64_t index = it.indices[j];
        DCR_EXPECTS(index >= next, errc::invalid_argument,
                    where() + ": indices not strictly increasing at record " + std::to_string(j));
        DCR_EXPECTS(index < numel, errc::out_of_range,
                    where() + ": index " + std::to_string(index) + " at record " +
                        std::to_string(j) + " >= numel " + std::to_string(numel));
        raw += detail::varint_size(index - next);
        next = index + 1;
      }
      location_sizes_[i] = raw;
      ids_[i] = {it.tensor, static_cast<std::uint32_t>(i)};
      bound += detail::zstd_compress_bound(raw) + detail::zstd_compress_bound(it.values.size());
    }
    std::sort(ids_.begin(), ids_.end());
    for (std::size_t k = 1; k < ids_.size(); ++k)
      DCR_EXPECTS(ids_[k - 1].first != ids_[k].first, errc::invalid_argument,
                  "payload_encoder: items " + std::to_string(ids_[k - 1].second) + " and " +
                      std::to_string(ids_[k].second) + " both name tensor '" +
                      registry.tensors()[ids_[k].first].name + "'");

    // Pass 2: streams first (their sizes go into the entries), then table, header, checksum.
    out.resize(bound);
    std::byte* const base = out.data();
    std::size_t pos = payload_format::header_size + items.size() * payload_format::entry_size;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const item& it = items[i];
      item_entry e;
      e.tensor = it.tensor;
      e.dtype_code = static_cast<std::uint8_t>(it.type);
      e.encoding_code = static_cast<std::uint8_t>(it.enc);
      e.location_code = static_cast<std::uint8_t>(location_coding::skip_varint);
      e.value_code = static_cast<std::uint8_t>(options_.byte_planes ? value_coding::byte_planes
                                                                    : value_coding::raw);
      e.count = it.count();
      e.numel = static_cast<std::uint64_t>(registry.tensors()[it.tensor].numel());

      locations_.resize(location_sizes_[i]);
      std::byte* p = locations_.data();
      std::uint64_t next = 0;
      for (const std::uint64_t index : it.indices) {
        p = detail::put_varint(p, index - next);
        next = index + 1;
      }
      e.location_raw_size = locations_.size();
      e.location_size =
          zstd_.compress(locations_, std::span<std::byte>(base + pos, out.size() - pos));
      pos += e.location_size;

      std::span<const std::byte> values = it.values;
      const bool planes = options_.byte_planes && it.word_bytes() > 1;
      if (planes || std::endian::native != std::endian::little) {
        values_.resize(it.values.size());
        visit_word(it.word_bytes(), [&]<class W>(W) {
          if (planes)
            detail::split_byte_planes<W>(it.values.data(), it.count(), values_.data());
          else
            detail::words_to_le<W>(it.values.data(), it.count(), values_.data());
        });
        values = values_;
      }
      e.value_raw_size = values.size();
      e.value_size = zstd_.compress(values, std::span<std::byte>(base + pos, out.size() - pos));
      pos += e.value_size;

      write_entry(base + payload_format::header_size + i * payload_format::entry_size, e);
    }
    const std::size_t total = pos + payload_format::trailer_size;
    out.resize(total);
    write_header(out.data(), header, static_cast<std::uint32_t>(items.size()), total);
    detail::store_le<std::uint64_t>(out.data() + pos, XXH3_64bits(out.data(), pos));
  }

 private:
  static void write_header(std::byte* p, const payload_header& h, std::uint32_t count,
                           std::uint64_t total) noexcept {
    using detail::store_le;
    std::memset(p, 0, payload_format::header_size);  // flags and reserved fields are zero
    store_le<std::uint32_t>(p + 0, payload_format::magic);
    store_le<std::uint16_t>(p + 4, payload_format::version);
    store_le<std::uint16_t>(p + 8, payload_format::header_size);
    store_le<std::uint16_t>(p + 10, payload_format::entry_size);
    store_le<std::uint64_t>(p + 16, h.registry_fingerprint);
    store_le<std::uint64_t>(p + 24, h.id.base_version);
    store_le<std::uint64_t>(p + 32, h.id.target_version);
    store_le<std::uint32_t>(p + 40, h.id.attempt);
    store_le<std::uint32_t>(p + 44, h.id.owner);
    store_le<std::uint32_t>(p + 48, h.id.sequence);
    store_le<std::uint32_t>(p + 52, count);
    store_le<std::uint64_t>(p + 56, total);
  }
  static void write_entry(std::byte* p, const item_entry& e) noexcept {
    using detail::store_le;
    store_le<std::uint32_t>(p + 0, e.tensor);
    store_le<std::uint8_t>(p + 4, e.dtype_code);
    store_le<std::uint8_t>(p + 5, e.encoding_code);
    store_le<std::uint8_t>(p + 6, e.location_code);
    store_le<std::uint8_t>(p + 7, e.value_code);
    store_le<std::uint64_t>(p + 8, e.count);
    store_le<std::uint64_t>(p + 16, e.numel);
    store_le<std::uint64_t>(p + 24, e.location_size);
    store_le<std::uint64_t>(p + 32, e.location_raw_size);
    store_le<std::uint64_t>(p + 40, e.value_size);
    store_le<std::uint64_t>(p + 48, e.value_raw_size);
    store_le<std::uint64_t>(p + 56, 0);  // reserved
  }

  codec_options options_;
  detail::zstd_compressor zstd_;
  std::vector<std::uint64_t> location_sizes_;
  std::vector<std::pair<tensor_id, std::uint32_t>> ids_;
  std::vector<std::byte> locations_;
  std::vector<std::byte> values_;
};

/// Decodes and validates payloads. Owns a zstd context and scratch reused by every call; one per
/// thread.
class payload_decoder {
 public:
  payload_decoder() = default;

  /// Reads and validates the fixed header only (no checksum, no table): length, magic, version,
  /// header and entry sizes, flags and reserved fields zero, total size equal to bytes.size(),
  /// room for the item table. Throws truncated_payload, corrupt_payload, unsupported_version,
  /// reserved_bits_set or overflow (docs/format.md, "Validation order").
  [[nodiscard]] static payload_header peek_header(std::span<const std::byte> bytes) {
    return read_header(bytes).header;
  }

  /// The payload's total size, read from its first header_size bytes (`prefix` may be longer)
  /// with peek_header's checks except those relating the total size to the bytes at hand: how
  /// many bytes a stream reader must receive before decoding. At least header_size +
  /// item_count * entry_size + trailer_size.
  [[nodiscard]] static std::uint64_t peek_size(std::span<const std::byte> prefix) {
    return read_header(prefix, false).total;
  }

  /// peek_header, then the checksum, then the item table: every entry's reserved field zero and
  /// its two frames lying back to back in the stream area, which they fill exactly. Fills
  /// `entries` (reusing its capacity) and returns the header. Nothing is checked against a
  /// registry and nothing is decompressed; decode() does both.
  static payload_header read_table(std::span<const std::byte> bytes,
                                   std::vector<item_entry>& entries) {
    const header_fields h = read_header(bytes);
    const auto body = static_cast<std::size_t>(h.total - payload_format::trailer_size);
    const std::uint64_t stored = detail::load_le<std::uint64_t>(bytes.data() + body);
    const std::uint64_t computed = XXH3_64bits(bytes.data(), body);
    DCR_EXPECTS(stored == computed, errc::corrupt_payload,
                "payload: checksum mismatch (trailer at byte " + std::to_string(body) + ")");

    entries.resize(h.count);
    std::uint64_t pos = payload_format::header_size + h.count * payload_format::entry_size;
    for (std::size_t i = 0; i < h.count; ++i) {
      const std::byte* p =
          bytes.data() + payload_format::header_size + i * payload_format::entry_size;
      item_entry& e = entries[i];
      e.tensor = detail::load_le<std::uint32_t>(p + 0);
      e.dtype_code = detail::load_le<std::uint8_t>(p + 4);
      e.encoding_code = detail::load_le<std::uint8_t>(p + 5);
      e.location_code = detail::load_le<std::uint8_t>(p + 6);
      e.value_code = detail::load_le<std::uint8_t>(p + 7);
      e.count = detail::load_le<std::uint64_t>(p + 8);
      e.numel = detail::load_le<std::uint64_t>(p + 16);
      e.location_size = detail::load_le<std::uint64_t>(p + 24);
      e.location_raw_size = detail::load_le<std::uint64_t>(p + 32);
      e.value_size = detail::load_le<std::uint64_t>(p + 40);
      e.value_raw_size = detail::load_le<std::uint64_t>(p + 48);
      DCR_EXPECTS(detail::load_le<std::uint64_t>(p + 56) == 0, errc::reserved_bits_set,
                  "payload: " + detail::entry_where(i, e.tensor, nullptr) + ": reserved field set");
      // Subtractions from what is left cannot overflow, unlike sums of hostile sizes.
      DCR_EXPECTS(e.location_size <= body - pos && e.value_size <= body - pos - e.location_size,
                  errc::corrupt_payload,
                  "payload: " + detail::entry_where(i, e.tensor, nullptr) + ": streams of " +
                      std::to_string(e.location_size) + " + " + std::to_string(e.value_size) +
                      " bytes at byte " + std::to_string(pos) +
                      " overrun the stream area ending at " + std::to_string(body));
      e.location_offset = pos;
      e.value_offset = pos + e.location_size;
      pos = e.value_offset + e.value_size;
    }
    DCR_EXPECTS(pos == body, errc::corrupt_payload,
                "payload: streams end at byte " + std::to_string(pos) + ", checksum is at byte " +
                    std::to_string(body));
    return h.header;
  }

  /// Validates all of `bytes` as a payload for `registry` before returning anything: read_table's
  /// checks; if `expect` is given, base version, target version and attempt equal to it
  /// (stale_payload); registry fingerprint (registry_mismatch); per entry, tensor id in the registry
  /// (unknown_tensor), dtype equal to the registry's (dtype_mismatch), encoding and codings known
  /// to format version 1 (unsupported_version), numel equal to the registry's (shape_mismatch),
  /// count <= numel (overflow), raw sizes consistent with count (corrupt_payload), each stream one
  /// zstd frame of exactly that raw size (corrupt_payload), no two entries naming one tensor
  /// (corrupt_payload); then decompresses every stream and checks every index < numel
  /// (out_of_range; the location coding makes indices strictly increasing by construction).
  /// Fills `items` (reusing its capacity and that of its vectors; values in host byte order, in
  /// each item's encoding) and returns the header. On failure throws dcr::error naming the item,
  /// tensor and byte offset; `items` is then unspecified and nothing else is touched. Buffers are
  /// sized only from bounded fields: at most count * (8 + word size) bytes per item, count <=
  /// the registry's numel, and no frame may claim more than 32768 bytes per compressed byte.
  payload_header decode(std::span<const std::byte> bytes, const tensor_registry& registry,
                        std::vector<item>& items, const transition_filter* expect = nullptr) {
    const payload_header header = read_table(bytes, entries_);
    if (expect != nullptr) {
      DCR_EXPECTS(header.id.base_version == expect->base_version &&
                      header.id.target_version == expect->target_version &&
                      header.id.attempt == expect->attempt,
                  errc::stale_payload,
                  "payload: transition " + std::to_string(header.id.base_version) + "->" +
                      std::to_string(header.id.target_version) + " attempt " +
                      std::to_string(header.id.attempt) + ", expected " +
                      std::to_string(expect->base_version) + "->" +
                      std::to_string(expect->target_version) + " attempt " +
                      std::to_string(expect->attempt));
    }
    DCR_EXPECTS(header.registry_fingerprint == registry.fingerprint(), errc::registry_mismatch,
                "payload: registry fingerprint differs from the receiver's (built for another "
                "model)");

    // Pass 1: every entry against the registry and every frame header, before any allocation
    // sized by the payload.
    ids_.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const item_entry& e = entries_[i];
      const auto where = [&] { return "payload: " + detail::entry_where(i, e.tensor, &registry); };
      DCR_EXPECTS(e.tensor < registry.size(), errc::unknown_tensor,
                  where() + ": tensor id not in the registry of " +
                      std::to_string(registry.size()) + " tensors");
      const canonical_tensor& t = registry.tensors()[e.tensor];
      DCR_EXPECTS(e.dtype_code == static_cast<std::uint8_t>(t.type), errc::dtype_mismatch,
                  where() + ": dtype code " + std::to_string(e.dtype_code) + ", registry has " +
                      std::string(dtype_name(t.type)));
      DCR_EXPECTS(
          e.encoding_code < 0x80 && is_supported_encoding(static_cast<encoding>(e.encoding_code)),
          errc::unsupported_version,
          where() + ": encoding " + std::to_string(e.encoding_code) + " not in format version 1");
      DCR_EXPECTS(e.location_code == static_cast<std::uint8_t>(location_coding::skip_varint),
                  errc::unsupported_version,
                  where() + ": location coding " + std::to_string(e.location_code) +
                      " not in format version 1");
      DCR_EXPECTS(
          e.value_code == static_cast<std::uint8_t>(value_coding::raw) ||
              e.value_code == static_cast<std::uint8_t>(value_coding::byte_planes),
          errc::unsupported_version,
          where() + ": value coding " + std::to_string(e.value_code) + " not in format version 1");
      const auto numel = static_cast<std::uint64_t>(t.numel());
      DCR_EXPECTS(e.numel == numel, errc::shape_mismatch,
                  where() + ": numel " + std::to_string(e.numel) + ", registry has " +
                      std::to_string(numel));
      DCR_EXPECTS(e.count <= numel, errc::overflow,
                  where() + ": " + std::to_string(e.count) + " records exceed numel " +
                      std::to_string(numel));
      const std::uint64_t word = dtype_size(t.type);
      DCR_EXPECTS(e.count <= std::numeric_limits<std::uint64_t>::max() / detail::varint_max_bytes,
                  errc::overflow,
                  where() + ": record count " + std::to_string(e.count) + " overflows");
      DCR_EXPECTS(e.value_raw_size == e.count * word, errc::corrupt_payload,
                  where() + ": value stream of " + std::to_string(e.value_raw_size) +
                      " raw bytes for " + std::to_string(e.count) + " words of " +
                      std::to_string(word) + " bytes");
      DCR_EXPECTS(e.location_raw_size >= e.count &&
                      e.location_raw_size <= detail::max_location_raw_size(e.count, numel),
                  errc::corrupt_payload,
                  where() + ": location stream of " + std::to_string(e.location_raw_size) +
                      " raw bytes cannot hold " + std::to_string(e.count) + " records");
      check_frame(bytes, e.location_offset, e.location_size, e.location_raw_size, where,
                  "location");
      check_frame(bytes, e.value_offset, e.value_size, e.value_raw_size, where, "value");
      ids_[i] = {e.tensor, static_cast<std::uint32_t>(i)};
    }
    std::sort(ids_.begin(), ids_.end());
    for (std::size_t k = 1; k < ids_.size(); ++k)
      DCR_EXPECTS(ids_[k - 1].first != ids_[k].first, errc::corrupt_payload,
                  "payload: items " + std::to_string(ids_[k - 1].second) + " and " +
                      std::to_string(ids_[k].second) + " both name tensor '" +
                      registry.tensors()[ids_[k].first].name + "'");

    // Pass 2: decompress and decode into `items`.
    items.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const item_entry& e = entries_[i];
      const auto where = [&] { return "payload: " + detail::entry_where(i, e.tensor, &registry); };
      item& it = items[i];
      it.tensor = e.tensor;
      it.type = static_cast<dtype>(e.dtype_code);
      it.enc = static_cast<encoding>(e.encoding_code);
      const auto count = static_cast<std::size_t>(e.count);

      decompress(bytes, e.location_offset, e.location_size, scratch_, e.location_raw_size, where,
                 "location");
      it.indices.resize(count);
      const std::byte* p = scratch_.data();
      const std::byte* const end = p + scratch_.size();
      std::uint64_t next = 0;
      for (std::size_t j = 0; j < count; ++j) {
        std::uint64_t skip = 0;
        DCR_EXPECTS(detail::get_varint(p, end, skip), errc::corrupt_payload,
                    where() + ": invalid varint for record " + std::to_string(j) +
                        " in the location stream at byte " + std::to_string(e.location_offset));
        DCR_EXPECTS(skip < e.numel - next, errc::out_of_range,
                    where() + ": record " + std::to_string(j) + " index " +
                        (skip > ~next ? std::string("beyond 2^64") : std::to_string(next + skip)) +
                        " >= numel " + std::to_string(e.numel));
        it.indices[j] = next + skip;
        next += skip + 1;
      }
      DCR_EXPECTS(p == end, errc::corrupt_payload,
                  where() + ": " + std::to_string(end - p) +
                      " bytes left over in the location stream at byte " +
                      std::to_string(e.location_offset));

      const bool planes = e.value_code == static_cast<std::uint8_t>(value_coding::byte_planes) &&
                          dtype_size(it.type) > 1;
      if (!planes && std::endian::native == std::endian::little) {
        decompress(bytes, e.value_offset, e.value_size, it.values, e.value_raw_size, where,
                   "value");
      } else {
        decompress(bytes, e.value_offset, e.value_size, scratch_, e.value_raw_size, where, "value");
        it.values.resize(scratch_.size());
        visit_word(dtype_size(it.type), [&]<class W>(W) {
          if (planes)
            detail::join_byte_planes<W>(scratch_.data(), count, it.values.data());
          else
            detail::le_to_words<W>(scratch_.data(), count, it.values.data());
        });
      }
    }
    return header;
  }

 private:
  struct header_fields {
    payload_header header;
    std::uint32_t count;
    std::uint64_t total;
  };

  // `whole`: bytes is the entire payload (total_size must equal its length), not a prefix.
  static header_fields read_header(std::span<const std::byte> bytes, bool whole = true) {
    using detail::load_le;
    const std::byte* p = bytes.data();
    DCR_EXPECTS(bytes.size() < 4 || load_le<std::uint32_t>(p) == payload_format::magic,
                errc::corrupt_payload, "payload: bad magic (not a dcr payload)");
    DCR_EXPECTS(bytes.size() >= payload_format::header_size, errc::truncated_payload,
                "payload: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                    std::to_string(payload_format::header_size) + "-byte header");
    const auto version = load_le<std::uint16_t>(p + 4);
    DCR_EXPECTS(version == payload_format::version, errc::unsupported_version,
                "payload: format version " + std::to_string(version) + ", this decoder reads " +
                    std::to_string(payload_format::version));
    DCR_EXPECTS(load_le<std::uint16_t>(p + 8) == payload_format::header_size &&
                    load_le<std::uint16_t>(p + 10) == payload_format::entry_size,
                errc::corrupt_payload, "payload: header or entry size differs from version 1's");
    bool reserved_zero = load_le<std::uint16_t>(p + 6) == 0 && load_le<std::uint32_t>(p + 12) == 0;
    for (std::size_t k = 64; k < payload_format::header_size; ++k)
      reserved_zero = reserved_zero && p[k] == std::byte{0};
    DCR_EXPECTS(reserved_zero, errc::reserved_bits_set,
                "payload: header flags or reserved bytes (6-7, 12-15, 64-79) not zero");
    const auto total = load_le<std::uint64_t>(p + 56);
    if (whole) {
      DCR_EXPECTS(total <= bytes.size(), errc::truncated_payload,
                  "payload: " + std::to_string(bytes.size()) + " bytes, header declares " +
                      std::to_string(total));
      DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
                  "payload: " + std::to_string(bytes.size() - total) +
                      " bytes after the declared end at byte " + std::to_string(total));
    }
    const auto count = load_le<std::uint32_t>(p + 52);
    DCR_EXPECTS(payload_format::header_size + std::uint64_t{count} * payload_format::entry_size +
                        payload_format::trailer_size <=
                    total,
                errc::overflow,
                "payload: " + std::to_string(count) + " item entries do not fit in " +
                    std::to_string(total) + " bytes");
    header_fields h;
    h.header.registry_fingerprint = load_le<std::uint64_t>(p + 16);
    h.header.id.base_version = load_le<std::uint64_t>(p + 24);
    h.header.id.target_version = load_le<std::uint64_t>(p + 32);
    h.header.id.attempt = load_le<std::uint32_t>(p + 40);
    h.header.id.owner = load_le<std::uint32_t>(p + 44);
    h.header.id.sequence = load_le<std::uint32_t>(p + 48);
    h.count = count;
    h.total = total;
    return h;
  }

  template <class Where>
  static void check_frame(std::span<const std::byte> bytes, std::uint64_t offset,
                          std::uint64_t size, std::uint64_t raw, const Where& where,
                          const char* stream) {
    auto why = detail::zstd_decompressor::frame_error(bytes.subspan(offset, size), raw);
    DCR_EXPECTS(why.empty(), errc::corrupt_payload,
                where() + ": " + stream + " stream at byte " + std::to_string(offset) + ": " + why);
  }

  template <class Where>
  void decompress(std::span<const std::byte> bytes, std::uint64_t offset, std::uint64_t size,
                  std::vector<std::byte>& dst, std::uint64_t raw, const Where& where,
                  const char* stream) {
    dst.resize(static_cast<std::size_t>(raw));
    auto why = zstd_.try_decompress(bytes.subspan(offset, size), dst);
    DCR_EXPECTS(why.empty(), errc::corrupt_payload,
                where() + ": " + stream + " stream at byte " + std::to_string(offset) + ": " + why);
  }

  detail::zstd_decompressor zstd_;
  std::vector<item_entry> entries_;
  std::vector<std::pair<tensor_id, std::uint32_t>> ids_;
  std::vector<std::byte> scratch_;
};

}  // namespace dcr
