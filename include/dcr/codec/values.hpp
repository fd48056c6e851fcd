// dcr/codec/values.hpp: what an item's value is, per element, for each encoding, and how it
// turns resident bits into new bits.
//
// The functors below are the single definition of each encoding: the CPU encoder and apply loops
// and the CUDA kernels all call them, so both backends produce the same bits. They work on stored
// words (uint8/16/32/64) with integer operations only; a float value never enters, so -0/+0, NaN
// payloads, infinities and subnormals round-trip exactly.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "dcr/codec/item.hpp"
#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// Opt-in tag: a value encoding declares `using encoding_concept = dcr::value_encoding_tag;`.
struct value_encoding_tag {};

/// A value encoding: a compile-time policy type with the per-element rule for both sides.
///   E::id                      the dcr::encoding it implements (its payload code)
///   E::idempotent              applying a value twice gives the same bits as once
///   E::needs_committed_bits    apply is exact only if resident bits equal the committed bits
///                              the value was made from (and the loader path preserves bits)
///   E::encode(old, new)        the value an owner sends for one changed element
///   E::apply(resident, value)  the bits a receiver writes
/// Both functions are constexpr and DCR_HOST_DEVICE, integer-only on stored words: the CPU
/// encoder, the apply sinks and the CUDA kernels share this one definition.
template <class E>
concept value_encoding =
    std::derived_from<typename E::encoding_concept, value_encoding_tag> &&
    std::same_as<std::remove_cv_t<decltype(E::id)>, encoding> &&
    std::same_as<std::remove_cv_t<decltype(E::idempotent)>, bool> &&
    std::same_as<std::remove_cv_t<decltype(E::needs_committed_bits)>, bool> &&
    requires(std::uint16_t a, std::uint32_t b) {
      { E::encode(a, a) } -> std::same_as<std::uint16_t>;
      { E::apply(a, a) } -> std::same_as<std::uint16_t>;
      { E::encode(b, b) } -> std::same_as<std::uint32_t>;
      { E::apply(b, b) } -> std::same_as<std::uint32_t>;
    };

/// overwrite: the value is the new bits, whatever was resident. Idempotent, always exact, the
/// only encoding a retry or a dense restore uses.
struct overwrite_encoding {
  using encoding_concept = value_encoding_tag;
  static constexpr encoding id = encoding::overwrite;
  static constexpr bool idempotent = true;
  static constexpr bool needs_committed_bits = false;
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W encode(W /*old_bits*/, W new_bits) noexcept {
    return new_bits;
  }
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W apply(W /*resident*/, W value) noexcept {
    return value;
  }
};

/// xor_mask: the value is old ^ new, zero exactly where bits did not change (small updates
/// leave high bits alone, so masks compress well). resident ^ mask gives the new bits exactly
/// when resident equals the old bits; applying a mask twice restores them, which is why a
/// payload is never applied twice.
struct xor_encoding {
  using encoding_concept = value_encoding_tag;
  static constexpr encoding id = encoding::xor_mask;
  static constexpr bool idempotent = false;
  static constexpr bool needs_committed_bits = true;
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W encode(W old_bits, W new_bits) noexcept {
    return static_cast<W>(old_bits ^ new_bits);
  }
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W apply(W resident, W value) noexcept {
    return static_cast<W>(resident ^ value);
  }
};

/// The order-preserving key of a sign-magnitude word: key(a) < key(b) (as unsigned integers)
/// exactly when a orders before b as a sign-magnitude number, with -0 just below +0 and NaNs
/// beyond the infinities by payload. Negative words (sign bit set) map to their complement, the
/// others gain the sign bit. A bijection on W, so unkey(key(w)) == w for every bit pattern.
template <storage_word W>
DCR_HOST_DEVICE constexpr W order_key(W bits) noexcept {
  constexpr W sign = static_cast<W>(W{1} << (8 * sizeof(W) - 1));
  return (bits & sign) != 0 ? static_cast<W>(~bits) : static_cast<W>(bits | sign);
}

/// The inverse of order_key.
template <storage_word W>
DCR_HOST_DEVICE constexpr W order_unkey(W key) noexcept {
  constexpr W sign = static_cast<W>(W{1} << (8 * sizeof(W) - 1));
  return (key & sign) != 0 ? static_cast<W>(key ^ sign) : static_cast<W>(~key);
}

/// ulp: the value is key(new) - key(old) modulo 2^w, with key = order_key. For float dtypes it
/// is the signed distance in representable values (units in the last place), so a small update
/// gives a small two's-complement value whatever the exponent; for integer dtypes it is still an
/// exact bijection, just rarely the smallest encoding. apply(resident, value) =
/// unkey(key(resident) + value) gives the new bits exactly when resident equals the old bits.
/// Not idempotent: a value applied twice moves twice as far.
struct ulp_encoding {
  using encoding_concept = value_encoding_tag;
  static constexpr encoding id = encoding::ulp;
  static constexpr bool idempotent = false;
  static constexpr bool needs_committed_bits = true;
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W encode(W old_bits, W new_bits) noexcept {
    return static_cast<W>(order_key<W>(new_bits) - order_key<W>(old_bits));
  }
  template <storage_word W>
  DCR_HOST_DEVICE static constexpr W apply(W resident, W value) noexcept {
    return order_unkey<W>(static_cast<W>(order_key<W>(resident) + value));
  }
};

namespace detail {

/// Zigzag map of a two's-complement word: 0, -1, 1, -2, ... become 0, 1, 2, 3, ..., so a small
/// signed value has small magnitude (high bytes zero). A bijection on W.
template <storage_word W>
DCR_HOST_DEVICE constexpr W zigzag_encode(W v) noexcept {
  constexpr unsigned top = 8 * sizeof(W) - 1;
  return static_cast<W>(static_cast<W>(v << 1) ^ static_cast<W>(W{0} - static_cast<W>(v >> top)));
}
template <storage_word W>
DCR_HOST_DEVICE constexpr W zigzag_decode(W z) noexcept {
  return static_cast<W>(static_cast<W>(z >> 1) ^ static_cast<W>(W{0} - static_cast<W>(z & 1u)));
}

}  // namespace detail

/// Byte plane k (k < sizeof(W)) of record i of n holds byte k (little-endian order) of record
/// i's word, zigzag-mapped first when Zig: planes[k * n + i]. Writes the sizeof(W) bytes of one
/// record (the CPU value coder and the device encode helper both call it).
template <storage_word W, bool Zig = false>
DCR_HOST_DEVICE constexpr void split_into_planes(W w, std::size_t i, std::size_t n,
                                                 std::byte* planes) noexcept {
  if constexpr (Zig) w = detail::zigzag_encode<W>(w);
  for (std::size_t k = 0; k < sizeof(W); ++k)
    planes[k * n + i] = static_cast<std::byte>(w >> (8 * k));
}

/// The skip of record k of strictly increasing `indices` (what the location codings store):
/// indices[k] - indices[k - 1] - 1, and indices[0] itself for k == 0.
DCR_HOST_DEVICE constexpr std::uint64_t location_skip(const std::uint64_t* indices,
                                                      std::size_t k) noexcept {
  return k == 0 ? indices[0] : indices[k] - indices[k - 1] - 1;
}

static_assert(value_encoding<overwrite_encoding>);
static_assert(value_encoding<xor_encoding>);
static_assert(value_encoding<ulp_encoding>);

/// Whether this build encodes and applies `e` (and the payload format carries it).
constexpr bool is_supported_encoding(encoding e) noexcept {
  return e == encoding::overwrite || e == encoding::xor_mask || e == encoding::ulp;
}

/// Calls f(E{}) with the policy type of `e`: the one place a run-time encoding becomes a
/// compile-time one. Throws dcr::error(errc::unsupported_version) for an encoding this build
/// does not implement.
template <class F>
decltype(auto) visit_encoding(encoding e, F&& f) {
  switch (e) {
    case encoding::overwrite: return f(overwrite_encoding{});
    case encoding::xor_mask: return f(xor_encoding{});
    case encoding::ulp: return f(ulp_encoding{});
    default: break;
  }
  throw error(errc::unsupported_version,
              "encoding " + std::to_string(static_cast<int>(e)) + " is not supported by this build");
}

/// out[i] = E::encode(old_bits[i], new_bits[i]) for the policy type E of `enc`, for every i below
/// out.size() (the three spans have that length; not re-checked). `out` may be `old_bits` itself
/// (values computed in place over gathered old words). The one loop that turns gathered words
/// into an item's values; throws unsupported_version for an encoding this build lacks.
template <storage_word W>
void encode_words(encoding enc, std::span<const W> old_bits, std::span<const W> new_bits,
                  std::span<W> out) {
  visit_encoding(enc, [&](auto e) {
    using E = decltype(e);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = E::encode(old_bits[i], new_bits[i]);
  });
}

/// Builds an item of `count = sorted_indices.size()` records for tensor `tensor` of type `type`,
/// its values in encoding `enc` (E::encode(old_bits[i], new_bits[i]) for the encoding's policy
/// type E: new bits, xor mask or ulp delta). `old_bits` and `new_bits` are gathered: entry i is
/// the word of element sorted_indices[i] (not whole tensors). Throws invalid_argument when W is
/// not the width of `type`, the three spans differ in length, the indices are not strictly
/// increasing, or `enc` is not a supported encoding. Checking indices against the tensor's numel
/// is left to the encoder, which has the registry.
template <storage_word W>
[[nodiscard]] item make_item(tensor_id tensor, dtype type, encoding enc,
                             std::span<const std::uint64_t> sorted_indices,
                             std::span<const W> old_bits, std::span<const W> new_bits);

}  // namespace dcr

#include "dcr/detail/codec/values.inl"
