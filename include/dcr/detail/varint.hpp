// dcr/detail/varint.hpp: the integer byte codings of the payload format (implementation only).
//
// Fixed-width little-endian loads and stores, independent of host byte order, and unsigned
// LEB128 varints: 7 bits per byte, least significant group first, high bit set on every byte but
// the last. The format requires minimal varints (no trailing 0x80 groups), so every value has
// exactly one encoding and equal inputs give equal payload bytes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "dcr/error.hpp"

namespace dcr::detail {

/// Stores `v` at `p` as sizeof(T) little-endian bytes.
template <class T>
inline void store_le(std::byte* p, T v) noexcept {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(T));
  } else {
    for (std::size_t k = 0; k < sizeof(T); ++k) p[k] = static_cast<std::byte>(v >> (8 * k));
  }
}

/// Loads sizeof(T) little-endian bytes from `p`.
template <class T>
[[nodiscard]] inline T load_le(const std::byte* p) noexcept {
  static_assert(std::is_unsigned_v<T>);
  T v{};
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof(T));
  } else {
    for (std::size_t k = 0; k < sizeof(T); ++k)
      v = static_cast<T>(v | static_cast<T>(std::to_integer<unsigned>(p[k])) << (8 * k));
  }
  return v;
}

/// Longest LEB128 encoding of a 64-bit value.
inline constexpr std::size_t varint_max_bytes = 10;

/// Bytes `put_varint` writes for `v` (1..10).
[[nodiscard]] constexpr std::size_t varint_size(std::uint64_t v) noexcept {
  // ceil(significant bits / 7), with 0 taking one byte.
  const int bits = 64 - std::countl_zero(v | 1u);
  return static_cast<std::size_t>((bits + 6) / 7);
}

/// Writes the minimal LEB128 encoding of `v` at `p` and returns the end of what it wrote.
/// The caller guarantees varint_size(v) bytes of room.
constexpr std::byte* put_varint(std::byte* p, std::uint64_t v) noexcept {
  while (v >= 0x80u) {
    *p++ = static_cast<std::byte>((v & 0x7fu) | 0x80u);
    v >>= 7;
  }
  *p++ = static_cast<std::byte>(v);
  return p;
}

/// Reads one LEB128 varint from [p, end) into `v` and advances `p` past it. Returns false,
/// leaving `p` unspecified, when the varint runs past `end`, is longer than 10 bytes, does not
/// fit 64 bits, or is not minimal (ends in a zero group after the first byte).
constexpr bool get_varint(const std::byte*& p, const std::byte* end, std::uint64_t& v) noexcept {
  std::uint64_t result = 0;
  for (std::size_t i = 0; i < varint_max_bytes; ++i) {
    if (p == end) return false;
    const auto b = std::to_integer<std::uint64_t>(*p++);
    // The tenth byte holds bit 63 only; anything more overflows.
    if (i == varint_max_bytes - 1 && b > 1u) return false;
    result |= (b & 0x7fu) << (7 * i);
    if ((b & 0x80u) == 0) {
      if (b == 0 && i > 0) return false;  // non-minimal: a redundant zero group
      v = result;
      return true;
    }
  }
  return false;
}

/// get_varint over a span at `pos` (advanced past the varint); throws corrupt_payload naming
/// `what` and the offset within the span when the bytes are not a valid minimal varint.
[[nodiscard]] inline std::uint64_t read_varint(std::span<const std::byte> bytes, std::size_t& pos,
                                               const char* what) {
  const std::byte* p = bytes.data() + pos;
  std::uint64_t v = 0;
  if (!get_varint(p, bytes.data() + bytes.size(), v)) [[unlikely]]
    throw error(errc::corrupt_payload, std::string(what) + ": invalid varint at byte " +
                                           std::to_string(pos) + " of " +
                                           std::to_string(bytes.size()));
  pos = static_cast<std::size_t>(p - bytes.data());
  return v;
}

}  // namespace dcr::detail
