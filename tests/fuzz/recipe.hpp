// tests/fuzz/recipe.hpp: the fuzz target's input format, shared by the target (which parses it)
// and the seed generator (which writes it).
//
// Bits 0..2 of byte 0 of every input select a mode (their value % 3); the rest is its body:
//   0  raw:     the body is a payload, decoded exactly as given.
//   1  fixed:   the body is a payload whose total-size field (header bytes 56..63) is
//               set to the body's length and whose XXH3-64 trailer is recomputed before
//               decoding, so mutations get past the checksum and reach the item table and the
//               zstd frames.
//   2  recipe:  the body describes items (see parse_recipe); the target encodes them with
//               payload_encoder, checks the round trip, then applies the recipe's byte edits to
//               the payload, fixes it up as in `fixed`, and decodes that. Valid structure by
//               construction, hostile where edited.
// Bits 3..5 of byte 0 choose the encoder options of the re-encode round trip (see
// reencode_options), bit 6 the general apply path instead of the compiled one, bit 7 post-apply
// verification.
//
// Recipe body (a reader past the end reads zeros, so every byte string is a recipe):
//   u8 options        bit 0: byte planes; bits 1-2: zstd level index into {1, 3, 6, -1};
//                     bit 3: not adaptive (the first release's codings); bit 4: exact choice
//   u8 codings        low nibble k: force location coding k - 1 (k in 1..known_location_codings),
//                     high nibble k: force value coding k - 1 (k in 1..known_value_codings)
//   u8 x5             base version, target version, attempt, owner, sequence
//   u8 items          % 10
//   per item:
//     u8 tensor       % tensor_count; an already used tensor moves on to the next unused one
//     u8 encoding     index into the encodings this build supports
//     u8 kind         % 3: 0 = listed records: u8 n, then n times (u8 gap, 255 = u16 gap
//                           follows; value word from the next bytes); records past the
//                           tensor's end are read and dropped
//                          1 = arithmetic run: u32 start, u8 stride - 1, u32 n (clamped to the
//                           tensor and to max_run_records), values from a xorshift seeded by u8
//                          2 = no records
//   edits, to the end, each u8 kind then by kind % 6 (see apply_edits):
//     0 byte:   u16 offset (mod payload size), u8 x: the byte ^= x, or, when x == 0, the
//               payload is cut there
//     1 field:  u8 entry, u8 field, u8 choice: the u64 at byte 8 * (field % 8) of table entry
//               entry % count (of the header, at 8 * (field % 10), when entry == 255 or the
//               table is empty) becomes an interesting value derived from it (interesting())
//     2 insert: u16 offset, u8 n, u8 b: inserts n % 32 + 1 copies of b (shifts what follows)
//     3 copy:   u8 from, u8 to: table entry from % count overwrites entry to % count
//     4 grow:   u8 entry, u8 which, u8 n: n % 32 + 1 zero bytes after the location (which even)
//               or value frame of the entry, added to that frame's size field
//     5 rle:    u8 entry, u8 which, u8 b, u8 drop: the location or value frame of the entry
//               becomes a zstd frame of RLE blocks of byte b, as long as the entry's raw size
//               field says (the most a frame may expand: 128 KiB per 4-byte block), its size
//               field updated; an odd `drop` leaves out the last drop / 2 + 1 blocks (all
//               of them, if there are no more)
// Field edits keep the rest of the table consistent, so they reach the checks that relate
// fields to each other (count against raw sizes, sizes against the stream area, duplicates).
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <span>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/dtype.hpp"
#include "fuzz_model.hpp"

namespace dcr_fuzz {

enum class input_mode : std::uint8_t { raw = 0, fixed = 1, recipe = 2 };

inline input_mode mode_of(std::uint8_t b) noexcept { return static_cast<input_mode>((b & 7) % 3); }

/// Location and value codings of payload format version 1 (dcr/codec/options.hpp), codes 0 up.
inline constexpr int known_location_codings = 4;
inline constexpr int known_value_codings = 5;

/// The encoder options of the round trip the target runs on every decoded payload: bit 3 of
/// the mode byte turns byte planes off, bit 4 adaptive coding choice off, bit 5 selects zstd
/// level 3 instead of 1.
inline dcr::codec_options reencode_options(std::uint8_t b) noexcept {
  dcr::codec_options o;
  o.byte_planes = (b >> 3 & 1) == 0;
  o.adaptive = (b >> 4 & 1) == 0;
  o.zstd_level = (b >> 5 & 1) != 0 ? 3 : 1;
  return o;
}

inline bool same_options(const dcr::codec_options& a, const dcr::codec_options& b) noexcept {
  return a.zstd_level == b.zstd_level && a.zstd_hash_log == b.zstd_hash_log &&
         a.byte_planes == b.byte_planes && a.adaptive == b.adaptive &&
         a.exact_choice == b.exact_choice && a.location == b.location && a.value == b.value;
}

/// The encodings this build supports, in code order.
inline const std::vector<dcr::encoding>& supported_encodings() {
  static const std::vector<dcr::encoding> all = [] {
    std::vector<dcr::encoding> v;
    for (int c = 0; c < 256; ++c)
      if (dcr::is_supported_encoding(static_cast<dcr::encoding>(c)))
        v.push_back(static_cast<dcr::encoding>(c));
    return v;
  }();
  return all;
}

/// Sets the total-size field to the payload's length and recomputes the checksum trailer, as far
/// as the payload is long enough to have them.
inline void fix_up(std::span<std::byte> payload) noexcept {
  namespace f = dcr::payload_format;
  if (payload.size() >= f::header_size) {
    std::uint64_t total = payload.size();
    for (int k = 0; k < 8; ++k) payload[56 + k] = static_cast<std::byte>(total >> (8 * k));
  }
  if (payload.size() >= f::header_size + f::trailer_size) {
    const std::size_t body = payload.size() - f::trailer_size;
    const std::uint64_t sum = XXH3_64bits(payload.data(), body);
    for (int k = 0; k < 8; ++k) payload[body + k] = static_cast<std::byte>(sum >> (8 * k));
  }
}

/// Reads little-endian integers from the input; zeros past its end.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::uint8_t> bytes) : p_(bytes.data()), end_(p_ + bytes.size()) {}
  std::uint8_t u8() noexcept { return p_ < end_ ? *p_++ : 0; }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(u8() | u8() << 8); }
  std::uint32_t u32() noexcept { return u16() | static_cast<std::uint32_t>(u16()) << 16; }
  [[nodiscard]] bool done() const noexcept { return p_ >= end_; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

/// Records of one arithmetic run at most: keeps recipe inputs fast (a run of the large tensor's
/// 4M elements takes about a second under the sanitizers and would dominate the fuzzing time).
/// Larger counts still reach the decoder through raw and fixed inputs and through edits.
inline constexpr std::uint64_t max_run_records = 65536;

/// What a recipe describes.
struct recipe {
  dcr::codec_options options;
  dcr::payload_header header;
  std::vector<dcr::item> items;
  struct edit {
    std::uint8_t kind;
    std::uint16_t offset;  ///< byte and insert edits
    std::uint8_t a, b, c, d;  ///< x; entry, field, choice; n, b; from, to; entry, which, n;
                              ///< entry, which, b, drop
  };
  std::vector<edit> edits;
};

/// Parses a recipe body into valid items for `registry` (every byte string parses).
inline void parse_recipe(std::span<const std::uint8_t> body, const dcr::tensor_registry& registry,
                         recipe& r) {
  byte_reader in(body);
  static constexpr int levels[4] = {1, 3, 6, -1};
  const std::uint8_t opt = in.u8();
  const std::uint8_t codings = in.u8();
  r.options = {};
  r.options.byte_planes = (opt & 1) != 0;
  r.options.zstd_level = levels[opt >> 1 & 3];
  r.options.adaptive = (opt & 8) == 0;
  r.options.exact_choice = (opt & 16) != 0;
  if (const int k = codings & 15; k >= 1 && k <= known_location_codings)
    r.options.location = static_cast<dcr::location_coding>(k - 1);
  if (const int k = codings >> 4; k >= 1 && k <= known_value_codings)
    r.options.value = static_cast<dcr::value_coding>(k - 1);
  r.header = {};
  r.header.id.attempt.base_version = in.u8();
  r.header.id.attempt.target_version = in.u8();
  r.header.id.attempt.number = in.u8();
  r.header.id.owner = in.u8();
  r.header.id.sequence = in.u8();
  r.header.registry_fingerprint = registry.fingerprint();

  const std::size_t n_tensors = registry.size();
  std::vector<bool> used(n_tensors, false);
  const std::size_t n_items = std::min<std::size_t>(in.u8() % 10, n_tensors);
  r.items.clear();
  for (std::size_t i = 0; i < n_items; ++i) {
    std::size_t t = in.u8() % n_tensors;
    while (used[t]) t = (t + 1) % n_tensors;
    used[t] = true;
    const dcr::canonical_tensor& ct = registry.tensors()[t];
    const auto& encs = supported_encodings();
    dcr::item it;
    it.tensor = static_cast<dcr::tensor_id>(t);
    it.type = ct.type;
    it.enc = encs[in.u8() % encs.size()];
    const auto numel = static_cast<std::uint64_t>(ct.numel());
    const std::size_t word = it.word_bytes();
    auto push_value = [&](std::uint64_t v) {
      for (std::size_t k = 0; k < word; ++k) it.values.push_back(static_cast<std::byte>(v >> (8 * k)));
    };
    switch (in.u8() % 3) {
      case 0: {
        const std::size_t n = in.u8();
        std::uint64_t next = 0;
        bool inside = true;
        for (std::size_t j = 0; j < n; ++j) {
          std::uint64_t gap = in.u8();
          if (gap == 255) gap += in.u16();
          std::uint64_t v = 0;
          for (std::size_t k = 0; k < word; ++k) v |= std::uint64_t{in.u8()} << (8 * k);
          inside = inside && gap < numel && next <= numel - 1 - gap;
          if (!inside) continue;
          it.indices.push_back(next + gap);
          next += gap + 1;
          push_value(v);
        }
        break;
      }
      case 1: {
        const std::uint32_t start = in.u32();
        const std::uint64_t stride = std::uint64_t{in.u8()} + 1;
        const std::uint32_t n = in.u32();
        std::uint64_t s = std::uint64_t{in.u8()} * 0x9e3779b97f4a7c15ull + 1;
        if (numel == 0) break;
        const std::uint64_t first = start % numel;
        const std::uint64_t room = (numel - 1 - first) / stride + 1;
        const std::uint64_t count = std::min<std::uint64_t>({n, room, max_run_records});
        it.indices.reserve(count);
        it.values.reserve(count * word);
        for (std::uint64_t j = 0; j < count; ++j) {
          it.indices.push_back(first + j * stride);
          s ^= s << 13;
          s ^= s >> 7;
          s ^= s << 17;
          push_value(s);
        }
        break;
      }
      default: break;
    }
    // Values are host-order words; push_value wrote little-endian bytes.
    if constexpr (std::endian::native == std::endian::big) {
      for (std::size_t j = 0; j < it.count(); ++j)
        std::reverse(it.values.begin() + static_cast<std::ptrdiff_t>(j * word),
                     it.values.begin() + static_cast<std::ptrdiff_t>((j + 1) * word));
    }
    r.items.push_back(std::move(it));
  }
  r.edits.clear();
  while (!in.done()) {
    recipe::edit e{};
    e.kind = in.u8() % 6;
    switch (e.kind) {
      case 0: e.offset = in.u16(); e.a = in.u8(); break;
      case 2: e.offset = in.u16(); e.a = in.u8(); e.b = in.u8(); break;
      case 3: e.a = in.u8(); e.b = in.u8(); break;
      case 5: e.a = in.u8(); e.b = in.u8(); e.c = in.u8(); e.d = in.u8(); break;
      default: e.a = in.u8(); e.b = in.u8(); e.c = in.u8(); break;  // 1, 4
    }
    r.edits.push_back(e);
  }
}

/// Values a size, count or code field is worth trying, given its current value.
inline std::uint64_t interesting(std::uint64_t current, std::uint8_t choice) noexcept {
  const std::uint64_t large = static_cast<std::uint64_t>(large_rows * large_cols);
  const std::uint64_t values[] = {
      0, 1, current + 1, current - 1, current * 2, current / 2, current + (1ull << 32),
      current ^ 0x80, large, large + 1, 1ull << 20, 1ull << 61, (~0ull / 8) + 1, 1ull << 63,
      ~0ull, current + 8, current - 8, current + (1ull << 40)};
  return values[choice % std::size(values)];
}

/// Applies the recipe's edits to `payload`, in order.
inline void apply_edits(const recipe& r, std::vector<std::byte>& payload) {
  namespace f = dcr::payload_format;
  const auto entries = [&]() -> std::size_t {
    if (payload.size() < f::header_size) return 0;
    std::uint32_t n = 0;
    for (int k = 0; k < 4; ++k) n |= std::to_integer<std::uint32_t>(payload[52 + k]) << (8 * k);
    return std::min<std::size_t>(n, (payload.size() - f::header_size) / f::entry_size);
  };
  const auto entry_at = [&](std::size_t i) { return f::header_size + i * f::entry_size; };
  const auto load64 = [&](std::size_t at) {
    std::uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= std::to_integer<std::uint64_t>(payload[at + k]) << (8 * k);
    return v;
  };
  const auto store64 = [&](std::size_t at, std::uint64_t v) {
    for (int k = 0; k < 8; ++k) payload[at + k] = static_cast<std::byte>(v >> (8 * k));
  };
  // Byte range of the location (which even) or value frame of entry i, from the table's sizes;
  // false when the table does not describe a frame inside the payload.
  const auto frame_of = [&](std::size_t i, std::uint8_t which, std::size_t& begin,
                            std::size_t& size_field) {
    const std::size_t n = entries();
    std::uint64_t pos = f::header_size + std::uint64_t{n} * f::entry_size;
    for (std::size_t k = 0; k <= i; ++k) {
      const std::uint64_t loc = load64(entry_at(k) + 24), val = load64(entry_at(k) + 40);
      if (k == i) {
        size_field = entry_at(k) + ((which & 1) == 0 ? 24 : 40);
        if ((which & 1) != 0) {
          if (loc > payload.size() - pos) return false;
          pos += loc;
        }
        begin = static_cast<std::size_t>(pos);
        return pos <= payload.size() && load64(size_field) <= payload.size() - pos;
      }
      if (loc > payload.size() - pos || val > payload.size() - pos - loc) return false;
      pos += loc + val;
    }
    return false;
  };
  for (const recipe::edit& e : r.edits) {
    if (payload.empty()) return;
    switch (e.kind) {
      case 0: {
        const std::size_t at = e.offset % payload.size();
        if (e.a == 0)
          payload.resize(at);
        else
          payload[at] ^= static_cast<std::byte>(e.a);
        break;
      }
      case 1: {
        const std::size_t n = entries();
        std::size_t at;
        if (e.a == 255 || n == 0)
          at = 8 * std::size_t{e.b % 10u};
        else
          at = entry_at(e.a % n) + 8 * std::size_t{e.b % 8u};
        if (at + 8 > payload.size()) break;
        std::uint64_t v = 0;
        for (int k = 0; k < 8; ++k) v |= std::to_integer<std::uint64_t>(payload[at + k]) << (8 * k);
        v = interesting(v, e.c);
        for (int k = 0; k < 8; ++k) payload[at + k] = static_cast<std::byte>(v >> (8 * k));
        break;
      }
      case 2: {
        const std::size_t at = e.offset % (payload.size() + 1);
        payload.insert(payload.begin() + static_cast<std::ptrdiff_t>(at), e.a % 32u + 1,
                       static_cast<std::byte>(e.b));
        break;
      }
      case 3: {
        const std::size_t n = entries();
        if (n == 0) break;
        const std::size_t from = entry_at(e.a % n), to = entry_at(e.b % n);
        std::memmove(payload.data() + to, payload.data() + from, f::entry_size);
        break;
      }
      case 4: {
        const std::size_t n = entries();
        std::size_t begin = 0, size_field = 0;
        if (n == 0 || !frame_of(e.a % n, e.b, begin, size_field)) break;
        const std::size_t grow = e.c % 32u + 1;
        const std::uint64_t size = load64(size_field);
        payload.insert(payload.begin() + static_cast<std::ptrdiff_t>(begin + size), grow,
                       std::byte{0});
        store64(size_field, size + grow);
        break;
      }
      default: {
        const std::size_t n = entries();
        std::size_t begin = 0, size_field = 0;
        if (n == 0 || !frame_of(e.a % n, e.b, begin, size_field)) break;
        // Raw size fields sit 8 bytes after the frame size fields; cap what one edit builds.
        const std::uint64_t raw = load64(size_field + 8);
        if (raw > (std::uint64_t{1} << 26)) break;
        constexpr std::uint64_t block = 1 << 17;  // zstd's largest block
        // Magic, then descriptor 0xe0: single segment, 8-byte content size, no checksum.
        std::vector<std::byte> frame = {std::byte{0x28}, std::byte{0xb5}, std::byte{0x2f},
                                        std::byte{0xfd}, std::byte{0xe0}};
        for (int k = 0; k < 8; ++k) frame.push_back(static_cast<std::byte>(raw >> (8 * k)));
        const std::uint64_t blocks = raw == 0 ? 1 : (raw + block - 1) / block;
        const std::uint64_t drop =
            (e.d & 1) != 0 ? std::min<std::uint64_t>(blocks, std::uint64_t{e.d} / 2 + 1) : 0;
        for (std::uint64_t k = 0; k + drop < blocks; ++k) {
          const std::uint64_t len = std::min(block, raw - k * block);
          const bool last = k + 1 == blocks - drop;
          // Block header: last-block bit, type 1 (RLE), size; then the repeated byte.
          const auto h = static_cast<std::uint32_t>(len << 3 | 1u << 1 | (last ? 1u : 0u));
          frame.insert(frame.end(), {static_cast<std::byte>(h), static_cast<std::byte>(h >> 8),
                                     static_cast<std::byte>(h >> 16), static_cast<std::byte>(e.c)});
        }
        const std::uint64_t old_size = load64(size_field);
        payload.erase(payload.begin() + static_cast<std::ptrdiff_t>(begin),
                      payload.begin() + static_cast<std::ptrdiff_t>(begin + old_size));
        payload.insert(payload.begin() + static_cast<std::ptrdiff_t>(begin), frame.begin(),
                       frame.end());
        store64(size_field, frame.size());
        break;
      }
    }
  }
}

/// Writes recipe bodies (the inverse of parse_recipe, for the seed generator).
class recipe_writer {
 public:
  recipe_writer(std::uint8_t options, std::uint8_t base, std::uint8_t target,
                std::uint8_t attempt, std::uint8_t owner, std::uint8_t sequence,
                std::uint8_t items, std::uint8_t mode_flags = 0, std::uint8_t codings = 0) {
    bytes_ = {static_cast<std::uint8_t>(static_cast<std::uint8_t>(input_mode::recipe) | mode_flags),
              options, codings, base, target, attempt, owner, sequence, items};
  }
  /// An item of `n` listed records with gaps[j] (< 255) and values (little-endian words).
  recipe_writer& listed(std::uint8_t tensor, std::uint8_t encoding_index,
                        std::span<const std::uint8_t> gaps, std::size_t word,
                        std::uint64_t value_seed) {
    push({tensor, encoding_index, 0, static_cast<std::uint8_t>(gaps.size())});
    for (std::uint8_t g : gaps) {
      bytes_.push_back(g);
      for (std::size_t k = 0; k < word; ++k) {
        value_seed = value_seed * 6364136223846793005ull + 1442695040888963407ull;
        bytes_.push_back(static_cast<std::uint8_t>(value_seed >> 56));
      }
    }
    return *this;
  }
  recipe_writer& run(std::uint8_t tensor, std::uint8_t encoding_index, std::uint32_t start,
                     std::uint8_t stride_minus_one, std::uint32_t n, std::uint8_t seed) {
    push({tensor, encoding_index, 1});
    push_u32(start);
    bytes_.push_back(stride_minus_one);
    push_u32(n);
    bytes_.push_back(seed);
    return *this;
  }
  recipe_writer& none(std::uint8_t tensor, std::uint8_t encoding_index) {
    push({tensor, encoding_index, 2});
    return *this;
  }
  recipe_writer& edit_byte(std::uint16_t offset, std::uint8_t x) {
    push({0, static_cast<std::uint8_t>(offset), static_cast<std::uint8_t>(offset >> 8), x});
    return *this;
  }
  recipe_writer& edit_field(std::uint8_t entry, std::uint8_t field, std::uint8_t choice) {
    push({1, entry, field, choice});
    return *this;
  }
  recipe_writer& edit_insert(std::uint16_t offset, std::uint8_t n, std::uint8_t b) {
    push({2, static_cast<std::uint8_t>(offset), static_cast<std::uint8_t>(offset >> 8), n, b});
    return *this;
  }
  recipe_writer& edit_copy(std::uint8_t from, std::uint8_t to) {
    push({3, from, to});
    return *this;
  }
  recipe_writer& edit_grow(std::uint8_t entry, std::uint8_t which, std::uint8_t n) {
    push({4, entry, which, n});
    return *this;
  }
  recipe_writer& edit_rle(std::uint8_t entry, std::uint8_t which, std::uint8_t b,
                          std::uint8_t drop) {
    push({5, entry, which, b, drop});
    return *this;
  }
  [[nodiscard]] const std::vector<std::uint8_t>& bytes() const noexcept { return bytes_; }

 private:
  void push(std::initializer_list<std::uint8_t> b) { bytes_.insert(bytes_.end(), b); }
  void push_u32(std::uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * k)));
  }
  std::vector<std::uint8_t> bytes_;
};

}  // namespace dcr_fuzz
