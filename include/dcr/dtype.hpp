// dcr/dtype.hpp: element types as stored words.
//
// dcr never compares or combines floating-point values as numbers: detection, encoding and apply
// all work on the stored bit pattern ("word") of each element. `dtype` names the element type
// (as safetensors spells it), `word_t<dt>` is the unsigned integer of the same width, and the
// helpers below convert between float and the narrow formats for tests and synthetic data only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "dcr/config.hpp"

namespace dcr {

/// Element types dcr understands. The numeric values are part of the payload format.
enum class dtype : std::uint8_t {
  bf16 = 1,
  f16 = 2,
  f32 = 3,
  f64 = 4,
  f8_e4m3 = 5,
  f8_e5m2 = 6,
  i8 = 16,
  u8 = 17,
  i16 = 18,
  u16 = 19,
  i32 = 20,
  u32 = 21,
  i64 = 22,
  u64 = 23,
  boolean = 24,
};

/// Bytes per element.
DCR_HOST_DEVICE constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f8_e4m3: case dtype::f8_e5m2: case dtype::i8: case dtype::u8: case dtype::boolean:
      return 1;
    case dtype::bf16: case dtype::f16: case dtype::i16: case dtype::u16:
      return 2;
    case dtype::f32: case dtype::i32: case dtype::u32:
      return 4;
    case dtype::f64: case dtype::i64: case dtype::u64:
      return 8;
  }
  return 0;
}

/// True for the floating-point formats (their words have a sign bit and NaN patterns).
DCR_HOST_DEVICE constexpr bool dtype_is_float(dtype t) noexcept {
  return t == dtype::bf16 || t == dtype::f16 || t == dtype::f32 || t == dtype::f64 ||
         t == dtype::f8_e4m3 || t == dtype::f8_e5m2;
}

/// True for the signed integer formats.
DCR_HOST_DEVICE constexpr bool dtype_is_signed_int(dtype t) noexcept {
  return t == dtype::i8 || t == dtype::i16 || t == dtype::i32 || t == dtype::i64;
}

/// The safetensors spelling ("BF16", "F32", "F8_E4M3", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::f8_e5m2: return "F8_E5M2";
    case dtype::i8: return "I8";
    case dtype::u8: return "U8";
    case dtype::i16: return "I16";
    case dtype::u16: return "U16";
    case dtype::i32: return "I32";
    case dtype::u32: return "U32";
    case dtype::i64: return "I64";
    case dtype::u64: return "U64";
    case dtype::boolean: return "BOOL";
  }
  return "?";
}

/// Parses a safetensors dtype name; nullopt if dcr does not support it.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (auto t : {dtype::bf16, dtype::f16, dtype::f32, dtype::f64, dtype::f8_e4m3, dtype::f8_e5m2,
                 dtype::i8, dtype::u8, dtype::i16, dtype::u16, dtype::i32, dtype::u32, dtype::i64,
                 dtype::u64, dtype::boolean}) {
    if (dtype_name(t) == s) return t;
  }
  return std::nullopt;
}

/// Parses the numeric payload code of a dtype; nullopt for unknown codes.
constexpr std::optional<dtype> dtype_from_code(std::uint8_t code) noexcept {
  const auto t = static_cast<dtype>(code);
  if (dtype_size(t) == 0) return std::nullopt;
  return t;
}

/// The unsigned word of a given byte width.
template <std::size_t Bytes> struct word_of_size;
template <> struct word_of_size<1> { using type = std::uint8_t; };
template <> struct word_of_size<2> { using type = std::uint16_t; };
template <> struct word_of_size<4> { using type = std::uint32_t; };
template <> struct word_of_size<8> { using type = std::uint64_t; };

/// The stored word of dtype `T`.
template <dtype T>
using word_t = typename word_of_size<dtype_size(T)>::type;

/// A stored word: one of the unsigned integer types dcr moves elements as.
template <class W>
concept storage_word = std::is_same_v<W, std::uint8_t> || std::is_same_v<W, std::uint16_t> ||
                       std::is_same_v<W, std::uint32_t> || std::is_same_v<W, std::uint64_t>;

/// Calls `f(W{})` with the word type matching a run-time byte width (1, 2, 4 or 8).
template <class F>
constexpr decltype(auto) visit_word(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    default: return f(std::uint64_t{});
  }
}

// ---- Bit casts and narrow-float conversions (synthetic data and tests; never on the apply path).

template <class To, class From>
DCR_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, from);
}

/// float -> bf16 word, round to nearest even; NaN stays a quiet NaN with the sign kept.
DCR_HOST_DEVICE constexpr std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

/// bf16 word -> float (exact).
DCR_HOST_DEVICE constexpr float bf16_to_float(std::uint16_t h) noexcept {
  return bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// float -> IEEE binary16 word, round to nearest even, with subnormals, infinities and NaN.
DCR_HOST_DEVICE constexpr std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a < 0x38800000u) {                                                      // f16 subnormal
    if (a < 0x33000000u) return sign;                                         // rounds to zero
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // 14..24
    const std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t up = (rem > half || (rem == half && (r & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (r + up));
  }
  const std::uint32_t rebased = a - 0x38000000u;  // exponent 127 -> 15
  const std::uint32_t r = rebased >> 13;
  const std::uint32_t rem = rebased & 0x1fffu;
  const std::uint32_t up = (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (r + up));
}

/// IEEE binary16 word -> float (exact).
DCR_HOST_DEVICE constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bit_cast<float>(sign);
  int e = -1;
  do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
  return bit_cast<float>(sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13));
}

}  // namespace dcr
