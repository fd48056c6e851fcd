// dcr/codec/payload.hpp: the payload codec, format version 1 (normative spec: docs/format.md).
//
// A payload packs one owner's items for one attempt of one transition: a fixed 80-byte header, a
// table of 64-byte item entries, per item a location stream and a value stream (each one standard
// zstd frame), and an XXH3-64 checksum of everything before it. Everything is little-endian.
// Each stream uses one of several codings (codec/options.hpp), chosen per item by the encoder
// (codec/choose.hpp) and recorded in the item's entry; streams.hpp writes and reads them.
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
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/choose.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/options.hpp"
#include "dcr/codec/streams.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/detail/zstd.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// Constants of payload format version 1 (docs/format.md).
namespace payload_format {
inline constexpr std::uint32_t magic = 0x50524344u;  ///< "DCRP" read as a little-endian u32
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_size = 80;
inline constexpr std::size_t entry_size = 64;
inline constexpr std::size_t trailer_size = 8;  ///< the XXH3-64 checksum
}  // namespace payload_format


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

/// Largest record count an entry may declare: keeps every size computed from it far from
/// overflow (no tensor comes near it).
inline constexpr std::uint64_t max_entry_count = std::uint64_t{1} << 56;

std::string entry_where(std::size_t i, tensor_id tensor, const tensor_registry* registry);

}  // namespace detail

/// A payload whose items are checked and whose streams are chosen and written raw, waiting for
/// compression: payload_encoder::stage() fills one, payload_encoder::finish() turns it into
/// payload bytes, possibly on another thread with another encoder (compression is most of the
/// encoding work; a pipeline stages on the thread that detects changes and compresses on a
/// second). Holds copies of what it needs, not references to the items. Reuse one per pipeline
/// slot: its buffers only grow.
class staged_payload {
 public:
  /// Items staged.
  [[nodiscard]] std::size_t item_count() const noexcept { return entries_.size(); }
  /// An upper bound of the payload finish() writes for it.
  [[nodiscard]] std::size_t max_encoded_size() const noexcept { return bound_; }
  /// Bytes held: raw streams and the frames of streams compressed while choosing.
  [[nodiscard]] std::size_t staged_bytes() const noexcept { return used_; }

 private:
  friend class payload_encoder;
  struct stream {
    std::uint8_t coding = 0;
    std::uint64_t raw_size = 0;
    bool compressed = false;  // bytes_[offset, offset + size) is the frame, else the raw content
    std::size_t offset = 0, size = 0;
    std::array<std::size_t, detail::raw_stream::max_breaks> sections{};
    std::size_t section_count = 0;
  };
  payload_header header_{};
  std::vector<item_entry> entries_;  // everything but the frame sizes
  std::vector<stream> streams_;      // location, value, location, value, ...
  std::vector<std::byte> bytes_;     // grow-only
  std::size_t used_ = 0;
  std::size_t bound_ = 0;
};

/// Encodes items into payloads. Owns a zstd context and scratch reused by every call; one per
/// thread.
class payload_encoder {
 public:
  /// An encoder with `options`; invalid_argument for a zstd level outside zstd's range.
  explicit payload_encoder(codec_options options = {}) : planner_(options) {}

  [[nodiscard]] const codec_options& options() const noexcept { return planner_.options(); }

  /// An upper bound of the size encode() writes for `items`, under any options. O(items).
  [[nodiscard]] static std::size_t max_encoded_size(std::span<const item> items);

  /// Overwrites `out` with the payload of `items` under `header`, in item order. `registry` is
  /// the model the items address: each item's tensor must be in it with the item's dtype, and its
  /// indices must be strictly increasing and below the tensor's numel; values.size() must be
  /// count() * word_bytes(); the encoding supported (is_supported_encoding); no two items may
  /// name one tensor; header.registry_fingerprint must equal registry.fingerprint(). Violations
  /// throw (invalid_argument, or unknown_tensor / dtype_mismatch / out_of_range for the tensor
  /// checks) before `out` is touched. For a given zstd library version and options, equal inputs
  /// give equal bytes. Allocates only to grow `out` and the scratch beyond sizes seen before.
  /// The same as stage() then finish().
  void encode(const payload_header& header, std::span<const item> items,
              const tensor_registry& registry, std::vector<std::byte>& out);

  /// encode()'s checks and coding choices, leaving every stream raw (or, where choosing compared
  /// compressed candidates, compressed) in `staged` for finish(). Throws what encode() throws,
  /// before `staged` is touched. Allocates only to grow `staged` and the scratch.
  void stage(const payload_header& header, std::span<const item> items,
             const tensor_registry& registry, staged_payload& staged);

  /// Compresses the streams of `staged` (which stays unchanged) and overwrites `out` with the
  /// payload encode() would have written for the same items, with this encoder's zstd level for
  /// the streams that stage() left raw. Allocates only to grow `out` and the scratch.
  void finish(const staged_payload& staged, std::vector<std::byte>& out);

 private:
  // Appends the planner's last choice (raw content or frame) to `staged`.
  void keep(staged_payload& staged, staged_payload::stream& st, const stream_choice& c);

  // Writes one staged stream's frame into body_ at `pos`; returns its size.
  std::uint64_t emit(const staged_payload& staged, const staged_payload::stream& st,
                     std::size_t pos);

  static void write_header(std::byte* p, const payload_header& h, std::uint32_t count,
                           std::uint64_t total) noexcept;
  static void write_entry(std::byte* p, const item_entry& e) noexcept;

  coding_planner planner_;
  std::vector<std::pair<tensor_id, std::uint32_t>> ids_;
  std::vector<std::size_t> runs_;  // per item, counted while checking its indices
  std::unique_ptr<std::byte[]> body_;  // grow-only: the payload being built (body_size_ bytes)
  std::size_t body_size_ = 0;
  staged_payload staged_;        // encode()'s own
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
  [[nodiscard]] static payload_header peek_header(std::span<const std::byte> bytes);

  /// The payload's total size, read from its first header_size bytes (`prefix` may be longer)
  /// with peek_header's checks except those relating the total size to the bytes at hand: how
  /// many bytes a stream reader must receive before decoding. At least header_size +
  /// item_count * entry_size + trailer_size.
  [[nodiscard]] static std::uint64_t peek_size(std::span<const std::byte> prefix);

  /// peek_header's checks with the checksum verified before the reserved fields and the item
  /// count (so damage reads as corrupt_payload), then the item table: every entry's reserved field zero and
  /// its two frames lying back to back in the stream area, which they fill exactly. Fills
  /// `entries` (reusing its capacity) and returns the header. Nothing is checked against a
  /// registry and nothing is decompressed; decode() does both.
  static payload_header read_table(std::span<const std::byte> bytes,
                                   std::vector<item_entry>& entries);

  /// Validates all of `bytes` as a payload for `registry` before returning anything: read_table's
  /// checks; if `expect` is given, base version, target version and attempt equal to it
  /// (stale_payload); registry fingerprint (registry_mismatch); per entry, tensor id in the registry
  /// (unknown_tensor), dtype equal to the registry's (dtype_mismatch), encoding and codings known
  /// (unsupported_version), numel equal to the registry's (shape_mismatch), count <= numel and
  /// <= 2^56 (overflow), raw sizes possible for the codings and count (corrupt_payload), each
  /// stream one zstd frame of exactly that raw size (corrupt_payload), no two entries naming one
  /// tensor (corrupt_payload); then decompresses every stream and validates its coding field by
  /// field (docs/format.md lists every check and its error), every index < numel (out_of_range)
  /// and strictly increasing. Fills `items` (values in host byte order, in each item's encoding)
  /// and returns the header. On failure throws dcr::error naming the item, tensor, stream and
  /// byte offset, and `items` is unchanged. The items are decoded into the decoder's own vector,
  /// which then trades places with `items`: once both have held payloads as large (two calls),
  /// decoding allocates nothing. Buffers are sized only from bounded fields: per item the indices
  /// (8 bytes a record), the words (word size a record) and one raw stream at a time (at most
  /// 10 bytes a record plus 16, or numel / 8 bytes for a bitmap), with count <= the registry's
  /// numel, and no frame may claim more than 32768 bytes per compressed byte.
  payload_header decode(std::span<const std::byte> bytes, const tensor_registry& registry,
                        std::vector<item>& items, const attempt_key* expect = nullptr);

 private:
  struct header_fields {
    payload_header header;
    std::uint32_t count;
    std::uint64_t total;
  };

  // `whole`: bytes is the entire payload (total_size must equal its length), not a prefix.
  // How much of the payload read_header may rely on: all of it with the checksum (read_table),
  // all of it without (peek_header), or a prefix (peek_size).
  enum class header_scope { checksummed, whole, prefix };

  // The header's checks in the order of docs/format.md: the fields that say how to read the rest
  // (magic, version, sizes, total size), then the checksum (checksummed scope), then reserved
  // bytes and the item count, so that damage anywhere but in the version field reads as
  // corrupt_payload while a well-formed payload with reserved bits set reads as
  // reserved_bits_set.
  static header_fields read_header(std::span<const std::byte> bytes,
                                   header_scope scope = header_scope::whole);

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
  std::vector<item> decoded_;  // trades places with the caller's items on success
};

}  // namespace dcr

#include "dcr/detail/codec/payload.inl"
