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

inline std::string entry_where(std::size_t i, tensor_id tensor, const tensor_registry* registry) {
  std::string s = "item " + std::to_string(i) + " (tensor id " + std::to_string(tensor);
  if (registry != nullptr && tensor < registry->size())
    s += " '" + registry->tensors()[tensor].name + "'";
  return s + ", entry at byte " +
         std::to_string(payload_format::header_size + i * payload_format::entry_size) + ")";
}

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
  [[nodiscard]] static std::size_t max_encoded_size(std::span<const item> items) {
    std::size_t n = payload_format::header_size + items.size() * payload_format::entry_size +
                    payload_format::trailer_size;
    for (const item& it : items)
      n += coding_planner::location_frame_bound(it.count()) +
           coding_planner::value_frame_bound(it.count(), it.word_bytes());
    return n;
  }

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
              const tensor_registry& registry, std::vector<std::byte>& out) {
    stage(header, items, registry, staged_);
    finish(staged_, out);
  }

  /// encode()'s checks and coding choices, leaving every stream raw (or, where choosing compared
  /// compressed candidates, compressed) in `staged` for finish(). Throws what encode() throws,
  /// before `staged` is touched. Allocates only to grow `staged` and the scratch.
  void stage(const payload_header& header, std::span<const item> items,
             const tensor_registry& registry, staged_payload& staged) {
    DCR_EXPECTS(header.registry_fingerprint == registry.fingerprint(), errc::invalid_argument,
                "payload_encoder: header registry fingerprint differs from the registry's");
    DCR_EXPECTS(items.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "payload_encoder: " + std::to_string(items.size()) + " items exceed 2^32 - 1");

    // Check every item and bound every stream, before writing anything.
    ids_.resize(items.size());
    runs_.resize(items.size());
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
                      " is not supported");
      DCR_EXPECTS(it.values.size() == it.count() * it.word_bytes(), errc::invalid_argument,
                  where() + ": " + std::to_string(it.values.size()) + " value bytes for " +
                      std::to_string(it.count()) + " records");
      const auto numel = static_cast<std::uint64_t>(t.numel());
      // One branch-free pass (it runs at memory speed) finds whether the indices are strictly
      // increasing and counts runs; only a failure walks them again to name the record.
      const std::uint64_t* const idx = it.indices.data();
      const std::size_t n = it.indices.size();
      std::size_t runs = n == 0 ? 0 : 1;
      bool increasing = true;
      for (std::size_t j = 1; j < n; ++j) {
        increasing &= idx[j] > idx[j - 1];
        runs += idx[j] != idx[j - 1] + 1 ? 1 : 0;
      }
      if (!increasing) [[unlikely]] {
        for (std::size_t j = 1; j < n; ++j)
          DCR_EXPECTS(idx[j] > idx[j - 1], errc::invalid_argument,
                      where() + ": indices not strictly increasing at record " + std::to_string(j));
      }
      DCR_EXPECTS(n == 0 || idx[n - 1] < numel, errc::out_of_range,
                  where() + ": index " + std::to_string(n == 0 ? 0 : idx[n - 1]) + " at record " +
                      std::to_string(n - 1) + " >= numel " + std::to_string(numel));
      runs_[i] = runs;
      ids_[i] = {it.tensor, static_cast<std::uint32_t>(i)};
      bound += coding_planner::location_frame_bound(it.count()) +
               coding_planner::value_frame_bound(it.count(), it.word_bytes());
    }
    std::sort(ids_.begin(), ids_.end());
    for (std::size_t k = 1; k < ids_.size(); ++k)
      DCR_EXPECTS(ids_[k - 1].first != ids_[k].first, errc::invalid_argument,
                  "payload_encoder: items " + std::to_string(ids_[k - 1].second) + " and " +
                      std::to_string(ids_[k].second) + " both name tensor '" +
                      registry.tensors()[ids_[k].first].name + "'");

    // Choose and write every stream.
    staged.header_ = header;
    staged.entries_.resize(items.size());
    staged.streams_.resize(2 * items.size());
    staged.used_ = 0;
    staged.bound_ = bound;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const item& it = items[i];
      item_entry& e = staged.entries_[i];
      e = item_entry{};
      e.tensor = it.tensor;
      e.dtype_code = static_cast<std::uint8_t>(it.type);
      e.encoding_code = static_cast<std::uint8_t>(it.enc);
      e.count = it.count();
      e.numel = static_cast<std::uint64_t>(registry.tensors()[it.tensor].numel());
      const stream_choice loc = planner_.plan_locations(it.indices, runs_[i]);
      keep(staged, staged.streams_[2 * i], loc);
      e.location_code = loc.coding;
      e.location_raw_size = loc.raw_size;
      const stream_choice val = visit_word(it.word_bytes(), [&]<class W>(W) {
        return planner_.plan_values<W>(it.values.data(), it.count());
      });
      keep(staged, staged.streams_[2 * i + 1], val);
      e.value_code = val.coding;
      e.value_raw_size = val.raw_size;
    }
  }

  /// Compresses the streams of `staged` (which stays unchanged) and overwrites `out` with the
  /// payload encode() would have written for the same items, with this encoder's zstd level for
  /// the streams that stage() left raw. Allocates only to grow `out` and the scratch.
  void finish(const staged_payload& staged, std::vector<std::byte>& out) {
    const std::size_t count = staged.entries_.size();
    if (body_size_ < staged.bound_) {
      // Not zero-filled: the bound is several times what is written, and a page of it is
      // touched only where the payload lands (a cold encoder would fault in all of it).
      body_.reset(new std::byte[staged.bound_]);
      body_size_ = staged.bound_;
    }
    std::size_t pos = payload_format::header_size + count * payload_format::entry_size;
    for (std::size_t i = 0; i < count; ++i) {
      item_entry e = staged.entries_[i];
      e.location_size = emit(staged, staged.streams_[2 * i], pos);
      pos += static_cast<std::size_t>(e.location_size);
      e.value_size = emit(staged, staged.streams_[2 * i + 1], pos);
      pos += static_cast<std::size_t>(e.value_size);
      write_entry(body_.get() + payload_format::header_size + i * payload_format::entry_size, e);
    }
    const std::size_t total = pos + payload_format::trailer_size;
    write_header(body_.get(), staged.header_, static_cast<std::uint32_t>(count), total);
    detail::store_le<std::uint64_t>(body_.get() + pos, XXH3_64bits(body_.get(), pos));
    out.resize(total);
    std::memcpy(out.data(), body_.get(), total);
  }

 private:
  // Appends the planner's last choice (raw content or frame) to `staged`.
  void keep(staged_payload& staged, staged_payload::stream& st, const stream_choice& c) {
    st.coding = c.coding;
    st.raw_size = c.raw_size;
    st.compressed = c.compressed;
    const std::span<const std::byte> bytes = c.compressed ? planner_.frame() : planner_.raw().bytes();
    st.offset = staged.used_;
    st.size = bytes.size();
    st.section_count = 0;
    if (!c.compressed)
      for (const std::size_t b : planner_.raw().sections()) st.sections[st.section_count++] = b;
    if (staged.bytes_.size() < staged.used_ + bytes.size())
      staged.bytes_.resize(std::max(staged.used_ + bytes.size(),
                                    staged.bytes_.size() + staged.bytes_.size() / 2));
    if (!bytes.empty()) std::memcpy(staged.bytes_.data() + staged.used_, bytes.data(), bytes.size());
    staged.used_ += bytes.size();
  }

  // Writes one staged stream's frame into body_ at `pos`; returns its size.
  std::uint64_t emit(const staged_payload& staged, const staged_payload::stream& st,
                     std::size_t pos) {
    const std::span<const std::byte> bytes(staged.bytes_.data() + st.offset, st.size);
    if (st.compressed) {
      std::memcpy(body_.get() + pos, bytes.data(), bytes.size());
      return bytes.size();
    }
    return planner_.compress(
        bytes, std::span<const std::size_t>(st.sections.data(), st.section_count),
        std::span<std::byte>(body_.get() + pos, body_size_ - pos));
  }

  static void write_header(std::byte* p, const payload_header& h, std::uint32_t count,
                           std::uint64_t total) noexcept {
    using detail::store_le;
    std::memset(p, 0, payload_format::header_size);  // flags and reserved fields are zero
    store_le<std::uint32_t>(p + 0, payload_format::magic);
    store_le<std::uint16_t>(p + 4, payload_format::version);
    store_le<std::uint16_t>(p + 8, payload_format::header_size);
    store_le<std::uint16_t>(p + 10, payload_format::entry_size);
    store_le<std::uint64_t>(p + 16, h.registry_fingerprint);
    store_le<std::uint64_t>(p + 24, h.id.attempt.base_version);
    store_le<std::uint64_t>(p + 32, h.id.attempt.target_version);
    store_le<std::uint32_t>(p + 40, h.id.attempt.number);
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
  [[nodiscard]] static payload_header peek_header(std::span<const std::byte> bytes) {
    return read_header(bytes).header;
  }

  /// The payload's total size, read from its first header_size bytes (`prefix` may be longer)
  /// with peek_header's checks except those relating the total size to the bytes at hand: how
  /// many bytes a stream reader must receive before decoding. At least header_size +
  /// item_count * entry_size + trailer_size.
  [[nodiscard]] static std::uint64_t peek_size(std::span<const std::byte> prefix) {
    return read_header(prefix, header_scope::prefix).total;
  }

  /// peek_header's checks with the checksum verified before the reserved fields and the item
  /// count (so damage reads as corrupt_payload), then the item table: every entry's reserved field zero and
  /// its two frames lying back to back in the stream area, which they fill exactly. Fills
  /// `entries` (reusing its capacity) and returns the header. Nothing is checked against a
  /// registry and nothing is decompressed; decode() does both.
  static payload_header read_table(std::span<const std::byte> bytes,
                                   std::vector<item_entry>& entries) {
    const header_fields h = read_header(bytes, header_scope::checksummed);
    const auto body = static_cast<std::size_t>(h.total - payload_format::trailer_size);

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
                        std::vector<item>& items, const attempt_key* expect = nullptr) {
    const payload_header header = read_table(bytes, entries_);
    if (expect != nullptr) {
      DCR_EXPECTS(header.id.attempt == *expect, errc::stale_payload,
                  "payload: of attempt " + to_string(header.id.attempt) + ", expected " +
                      to_string(*expect));
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
          where() + ": encoding " + std::to_string(e.encoding_code) + " is not supported");
      DCR_EXPECTS(detail::is_known_location_coding(e.location_code), errc::unsupported_version,
                  where() + ": location coding " + std::to_string(e.location_code) +
                      " is not supported");
      DCR_EXPECTS(detail::is_known_value_coding(e.value_code), errc::unsupported_version,
                  where() + ": value coding " + std::to_string(e.value_code) +
                      " is not supported");
      const auto numel = static_cast<std::uint64_t>(t.numel());
      DCR_EXPECTS(e.numel == numel, errc::shape_mismatch,
                  where() + ": numel " + std::to_string(e.numel) + ", registry has " +
                      std::to_string(numel));
      DCR_EXPECTS(e.count <= numel, errc::overflow,
                  where() + ": " + std::to_string(e.count) + " records exceed numel " +
                      std::to_string(numel));
      DCR_EXPECTS(e.count <= detail::max_entry_count, errc::overflow,
                  where() + ": record count " + std::to_string(e.count) + " exceeds 2^56");
      const std::uint64_t word = dtype_size(t.type);
      const auto vcoding = static_cast<value_coding>(e.value_code);
      DCR_EXPECTS(detail::value_raw_size_plausible(vcoding, e.value_raw_size, e.count, word),
                  errc::corrupt_payload,
                  where() + ": value stream of " + std::to_string(e.value_raw_size) +
                      " raw bytes cannot hold " + std::to_string(e.count) + " words of " +
                      std::to_string(word) + " bytes in value coding " +
                      std::to_string(e.value_code));
      const auto lcoding = static_cast<location_coding>(e.location_code);
      DCR_EXPECTS(
          detail::location_raw_size_plausible(lcoding, e.location_raw_size, e.count, numel),
          errc::corrupt_payload,
          where() + ": location stream of " + std::to_string(e.location_raw_size) +
              " raw bytes cannot hold " + std::to_string(e.count) + " records in location coding " +
              std::to_string(e.location_code));
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

    // Pass 2: decompress and decode into decoded_, which trades places with `items` at the end.
    decoded_.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const item_entry& e = entries_[i];
      const auto where = [&] { return "payload: " + detail::entry_where(i, e.tensor, &registry); };
      item& it = decoded_[i];
      it.tensor = e.tensor;
      it.type = static_cast<dtype>(e.dtype_code);
      it.enc = static_cast<encoding>(e.encoding_code);
      const auto count = static_cast<std::size_t>(e.count);

      decompress(bytes, e.location_offset, e.location_size, scratch_, e.location_raw_size, where,
                 "location");
      it.indices.resize(count);
      const auto stream_where = [&] {
        return where() + ": location stream at byte " + std::to_string(e.location_offset);
      };
      detail::read_locations(static_cast<location_coding>(e.location_code), scratch_, e.count,
                             e.numel, it.indices.data(), stream_where);

      const auto coding = static_cast<value_coding>(e.value_code);
      const bool direct = coding == value_coding::raw ||
                          (dtype_size(it.type) == 1 && coding == value_coding::byte_planes);
      if (direct && std::endian::native == std::endian::little) {
        decompress(bytes, e.value_offset, e.value_size, it.values, e.value_raw_size, where,
                   "value");
      } else {
        decompress(bytes, e.value_offset, e.value_size, scratch_, e.value_raw_size, where, "value");
        it.values.resize(count * dtype_size(it.type));
        const auto value_where = [&] {
          return where() + ": value stream at byte " + std::to_string(e.value_offset);
        };
        visit_word(dtype_size(it.type), [&]<class W>(W) {
          detail::read_values<W>(coding, scratch_, count, it.values.data(), value_where);
        });
      }
    }
    items.swap(decoded_);
    return header;
  }

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
                                   header_scope scope = header_scope::whole) {
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
    const auto total = load_le<std::uint64_t>(p + 56);
    const auto count = load_le<std::uint32_t>(p + 52);
    const auto entries_fit = [&] {
      return payload_format::header_size + std::uint64_t{count} * payload_format::entry_size +
                 payload_format::trailer_size <=
             total;
    };
    const auto entries_error = [&] {
      return "payload: " + std::to_string(count) + " item entries do not fit in " +
             std::to_string(total) + " bytes";
    };
    if (scope != header_scope::prefix) {
      DCR_EXPECTS(total <= bytes.size(), errc::truncated_payload,
                  "payload: " + std::to_string(bytes.size()) + " bytes, header declares " +
                      std::to_string(total));
      DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
                  "payload: " + std::to_string(bytes.size() - total) +
                      " bytes after the declared end at byte " + std::to_string(total));
    }
    if (scope == header_scope::checksummed) {
      DCR_EXPECTS(total >= payload_format::header_size + payload_format::trailer_size,
                  errc::overflow, entries_error());
      const auto body = static_cast<std::size_t>(total - payload_format::trailer_size);
      DCR_EXPECTS(load_le<std::uint64_t>(p + body) == XXH3_64bits(p, body),
                  errc::corrupt_payload,
                  "payload: checksum mismatch (trailer at byte " + std::to_string(body) + ")");
    }
    bool reserved_zero = load_le<std::uint16_t>(p + 6) == 0 && load_le<std::uint32_t>(p + 12) == 0;
    for (std::size_t k = 64; k < payload_format::header_size; ++k)
      reserved_zero = reserved_zero && p[k] == std::byte{0};
    DCR_EXPECTS(reserved_zero, errc::reserved_bits_set,
                "payload: header flags or reserved bytes (6-7, 12-15, 64-79) not zero");
    DCR_EXPECTS(entries_fit(), errc::overflow, entries_error());
    header_fields h;
    h.header.registry_fingerprint = load_le<std::uint64_t>(p + 16);
    h.header.id.attempt.base_version = load_le<std::uint64_t>(p + 24);
    h.header.id.attempt.target_version = load_le<std::uint64_t>(p + 32);
    h.header.id.attempt.number = load_le<std::uint32_t>(p + 40);
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
  std::vector<item> decoded_;  // trades places with the caller's items on success
};

}  // namespace dcr
