// dcr/apply/transform.hpp: element transforms a loader's final storage copy may apply.
//
// Most final storage copies move a canonical word unchanged into storage. Some engines keep a
// weight in another dtype than the checkpoint: an fp32 copy of a bf16 norm, a bf16 copy of an
// fp32 router. Such a loader calls `sink.copy(dst, src, dcr::element_transform::cast(from, to))`
// with `dst` a view of words of the storage dtype, and dcr applies the same cast on every path
// (dense refit, compiled apply, general apply, CUDA kernels), so all of them end with the same
// bits.
//
// Every cast here works on stored words with integer operations only (no float arithmetic, no
// dependence on the FPU rounding mode or on flush-to-zero), is constexpr and DCR_HOST_DEVICE:
//   * bf16 -> f32, f16 -> f32: exact widening. Every bit pattern maps to the f32 with the same
//     value; a NaN keeps its sign and payload (its quiet bit too, so a signalling NaN stays
//     signalling, as c10's bit-level conversion does).
//   * f32 -> bf16, f32 -> f16: round to nearest, ties to even. Overflow rounds to infinity,
//     f16 subnormals are produced exactly, a NaN stays a NaN with its sign kept and the quiet bit
//     set (the top payload bits are kept, so a payload never rounds into an infinity).
//   * bf16 -> f16, f16 -> bf16: widening to f32 and then rounding as above (one rounding).
//   * identity: the word itself.
// A cast is a function of one canonical word: the same word always gives the same stored word.
// Only the identity preserves bits, so a tensor placed through any other transform can take
// overwrite records only (see dcr/apply/placement.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// The transforms a sink applies to each element of a copy. The numeric values are stable
/// (placement records carry them to device kernels).
enum class cast_kind : std::uint8_t {
  identity = 0,
  bf16_to_f32 = 1,
  f16_to_f32 = 2,
  f32_to_bf16 = 3,
  f32_to_f16 = 4,
  bf16_to_f16 = 5,
  f16_to_bf16 = 6,
};

// ---- Per-element casts on words ---------------------------------------------------------------

/// bf16 word -> f32 word: exact (the bf16 is the top half of the f32).
DCR_HOST_DEVICE constexpr std::uint32_t bf16_bits_to_f32(std::uint16_t h) noexcept {
  return static_cast<std::uint32_t>(h) << 16;
}

/// f16 word -> f32 word: exact, subnormals normalized, NaN payload and quiet bit kept.
DCR_HOST_DEVICE constexpr std::uint32_t f16_bits_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return sign | 0x7f800000u | (mant << 13);
  if (exp != 0) return sign | ((exp + 112u) << 23) | (mant << 13);
  if (mant == 0) return sign;
  // Subnormal: value mant * 2^-24. Shift the leading one up to the implicit bit position.
  std::uint32_t e = 113u;  // exponent field of 2^-14, the smallest normal f16
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return sign | (e << 23) | ((mant & 0x3ffu) << 13);
}

/// f32 word -> bf16 word, round to nearest even; NaN stays a quiet NaN with its sign.
DCR_HOST_DEVICE constexpr std::uint16_t f32_bits_to_bf16(std::uint32_t u) noexcept {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  // No carry out of 32 bits: the largest finite |u| is 0x7f7fffff and the sign bit absorbs
  // the carry of a negative value into -infinity (0xff80), which is the correct rounding.
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

/// f32 word -> f16 word, round to nearest even with subnormals; overflow to infinity; NaN
/// stays a quiet NaN with its sign and top payload bits.
DCR_HOST_DEVICE constexpr std::uint16_t f32_bits_to_f16(std::uint32_t u) noexcept {
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past max
  if (a < 0x38800000u) {                                                     // f16 subnormal
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal: rounds to zero
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (a >> 23);  // 14..24
    const std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t up = (rem > half || (rem == half && (r & 1u) != 0)) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (r + up));
  }
  const std::uint32_t rebased = a - 0x38000000u;  // exponent bias 127 -> 15
  const std::uint32_t r = rebased >> 13;
  const std::uint32_t rem = rebased & 0x1fffu;
  const std::uint32_t up = (rem > 0x1000u || (rem == 0x1000u && (r & 1u) != 0)) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (r + up));  // a carry into the exponent is correct
}

// ---- Transform policy types -------------------------------------------------------------------

/// The identity: the word is stored unchanged, whatever its width.
struct identity_cast {
  static constexpr cast_kind kind = cast_kind::identity;
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W apply(W w) noexcept {
    return w;
  }
};

/// A dtype cast: `from_word`s of dtype `from_type` to `to_word`s of dtype `to_type`. Each
/// policy names one of the word functions above.
#define DCR_DEFINE_DTYPE_CAST(NAME, KIND, FROM, TO, EXPR)                            \
  struct NAME {                                                                      \
    static constexpr cast_kind kind = cast_kind::KIND;                               \
    static constexpr dtype from_type = dtype::FROM;                                  \
    static constexpr dtype to_type = dtype::TO;                                      \
    using from_word = word_t<dtype::FROM>;                                           \
    using to_word = word_t<dtype::TO>;                                               \
    DCR_HOST_DEVICE static constexpr to_word apply(from_word w) noexcept { return EXPR; } \
  };

DCR_DEFINE_DTYPE_CAST(bf16_to_f32_cast, bf16_to_f32, bf16, f32, bf16_bits_to_f32(w))
DCR_DEFINE_DTYPE_CAST(f16_to_f32_cast, f16_to_f32, f16, f32, f16_bits_to_f32(w))
DCR_DEFINE_DTYPE_CAST(f32_to_bf16_cast, f32_to_bf16, f32, bf16, f32_bits_to_bf16(w))
DCR_DEFINE_DTYPE_CAST(f32_to_f16_cast, f32_to_f16, f32, f16, f32_bits_to_f16(w))
DCR_DEFINE_DTYPE_CAST(bf16_to_f16_cast, bf16_to_f16, bf16, f16, f32_bits_to_f16(bf16_bits_to_f32(w)))
DCR_DEFINE_DTYPE_CAST(f16_to_bf16_cast, f16_to_bf16, f16, bf16, f32_bits_to_bf16(f16_bits_to_f32(w)))
#undef DCR_DEFINE_DTYPE_CAST

/// The one switch over cast_kind: f(T{}) with the policy type of `k`, or otherwise() for a value
/// outside the enumeration. DCR_HOST_DEVICE (device code passes a non-throwing `otherwise`).
template <class F, class G>
DCR_HOST_DEVICE constexpr decltype(auto) dispatch_cast(cast_kind k, F&& f, G&& otherwise) {
  switch (k) {
    case cast_kind::identity: return f(identity_cast{});
    case cast_kind::bf16_to_f32: return f(bf16_to_f32_cast{});
    case cast_kind::f16_to_f32: return f(f16_to_f32_cast{});
    case cast_kind::f32_to_bf16: return f(f32_to_bf16_cast{});
    case cast_kind::f32_to_f16: return f(f32_to_f16_cast{});
    case cast_kind::bf16_to_f16: return f(bf16_to_f16_cast{});
    case cast_kind::f16_to_bf16: return f(f16_to_bf16_cast{});
  }
  return otherwise();
}

/// Calls f(T{}) with the policy type of `k`. Throws errc::invalid_argument for a value outside
/// the enumeration (a corrupted placement record).
template <class F>
constexpr decltype(auto) visit_cast(cast_kind k, F&& f) {
  return dispatch_cast(k, f, [k]() -> decltype(f(identity_cast{})) {
    throw error(errc::invalid_argument,
                "dcr: cast kind " + std::to_string(static_cast<int>(k)) + " does not exist");
  });
}

/// Whether policy type T turns words W into words D (the identity: D == W).
template <class T, class W, class D>
inline constexpr bool cast_maps_v = [] {
  if constexpr (T::kind == cast_kind::identity)
    return std::is_same_v<W, D>;
  else
    return std::is_same_v<typename T::from_word, W> && std::is_same_v<typename T::to_word, D>;
}();

/// An element transform as a value: what a loader passes to sink.copy(dst, src, transform) and
/// what a placement record stores. Trivially copyable.
struct element_transform {
  cast_kind kind = cast_kind::identity;

  /// The word is stored unchanged (what the two-argument copy means).
  static constexpr element_transform identity() noexcept { return {}; }

  /// The cast from dtype `from` (the canonical tensor's dtype) to `to` (the storage dtype).
  /// from == to gives the identity. Throws errc::invalid_argument for a pair dcr does not cast
  /// (anything but bf16/f16/f32 among themselves).
  static constexpr element_transform cast(dtype from, dtype to) {
    if (from == to) return {};
    const auto is = [&](dtype a, dtype b) { return from == a && to == b; };
    if (is(dtype::bf16, dtype::f32)) return {cast_kind::bf16_to_f32};
    if (is(dtype::f16, dtype::f32)) return {cast_kind::f16_to_f32};
    if (is(dtype::f32, dtype::bf16)) return {cast_kind::f32_to_bf16};
    if (is(dtype::f32, dtype::f16)) return {cast_kind::f32_to_f16};
    if (is(dtype::bf16, dtype::f16)) return {cast_kind::bf16_to_f16};
    if (is(dtype::f16, dtype::bf16)) return {cast_kind::f16_to_bf16};
    throw error(errc::invalid_argument, "dcr::element_transform::cast: no cast from " +
                                            std::string(dtype_name(from)) + " to " +
                                            std::string(dtype_name(to)));
  }

  /// Only the identity keeps every stored bit, so only it admits xor/ulp records.
  [[nodiscard]] constexpr bool preserves_bits() const noexcept {
    return kind == cast_kind::identity;
  }

  /// Source and destination dtype of a cast (meaningless for the identity, which keeps the
  /// tensor's dtype).
  [[nodiscard]] constexpr dtype from() const {
    return visit_cast(kind, [](auto t) {
      if constexpr (decltype(t)::kind == cast_kind::identity) return dtype::u8;
      else return decltype(t)::from_type;
    });
  }
  [[nodiscard]] constexpr dtype to() const {
    return visit_cast(kind, [](auto t) {
      if constexpr (decltype(t)::kind == cast_kind::identity) return dtype::u8;
      else return decltype(t)::to_type;
    });
  }

  friend constexpr bool operator==(element_transform, element_transform) = default;
};

static_assert(std::is_trivially_copyable_v<element_transform>);

/// "identity" or "cast BF16->F32".
std::string transform_name(element_transform t);

/// Applies `t` to one word at run time (the loops dispatch once per copy through visit_cast;
/// this form serves checks and reference code). W and D must be the transform's word types
/// (checked by the sinks before any element is transformed); a mismatch returns 0.
template <storage_word D, storage_word W>
constexpr D transform_word(element_transform t, W w) {
  return visit_cast(t.kind, [&](auto c) -> D {
    using T = decltype(c);
    if constexpr (cast_maps_v<T, W, D>)
      return T::apply(w);
    else
      return D{0};
  });
}

/// Checks that `t` may carry the words of a canonical tensor of dtype `tensor_type` (W-wide)
/// into D-wide storage words. Throws errc::dtype_mismatch naming the tensor and the copy.
template <storage_word W, storage_word D>
void check_transform(element_transform t, dtype tensor_type, const std::string& where) {
  if (t.preserves_bits()) {
    DCR_EXPECTS(sizeof(D) == sizeof(W), errc::dtype_mismatch,
                where + ": identity copy from " + std::to_string(sizeof(W)) + "-byte words into " +
                    std::to_string(sizeof(D)) + "-byte words (pass a cast transform)");
    return;
  }
  DCR_EXPECTS(t.from() == tensor_type, errc::dtype_mismatch,
              where + ": " + transform_name(t) + " applied to a " +
                  std::string(dtype_name(tensor_type)) + " tensor");
  DCR_EXPECTS(dtype_size(t.to()) == sizeof(D), errc::dtype_mismatch,
              where + ": " + transform_name(t) + " into " + std::to_string(sizeof(D)) +
                  "-byte destination words");
}

}  // namespace dcr

#include "dcr/detail/apply/transform.inl"
