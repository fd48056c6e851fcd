// dcr/codec/values.hpp: what an item's value is, per element, for each encoding, and how it
// turns resident bits into new bits.
//
// The functors below are the single definition of each encoding: the CPU encoder and apply loops
// and the CUDA kernels all call them, so both backends produce the same bits. They work on stored
// words (uint8/16/32/64) with integer operations only; a float value never enters, so -0/+0, NaN
// payloads, infinities and subnormals round-trip exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "dcr/codec/item.hpp"
#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// xor encoding, owner side: the mask old ^ new. Zero exactly where the bits did not change.
template <storage_word W>
struct xor_encode {
  DCR_HOST_DEVICE constexpr W operator()(W old_bits, W new_bits) const noexcept {
    return static_cast<W>(old_bits ^ new_bits);
  }
};

/// xor encoding, receiver side: resident ^ mask. Gives the new bits exactly when resident equals
/// the old bits the mask was made from; applying the same mask twice restores the resident bits
/// (which is why a payload must never be applied twice).
template <storage_word W>
struct apply_xor {
  DCR_HOST_DEVICE constexpr W operator()(W resident, W mask) const noexcept {
    return static_cast<W>(resident ^ mask);
  }
};

/// overwrite encoding, receiver side: the new bits, whatever was resident. Idempotent.
template <storage_word W>
struct apply_overwrite {
  DCR_HOST_DEVICE constexpr W operator()(W /*resident*/, W new_bits) const noexcept {
    return new_bits;
  }
};

/// Builds an item of `count = sorted_indices.size()` records for tensor `tensor` of type `type`,
/// its values in encoding `enc`: old_bits[i] ^ new_bits[i] for xor_mask, new_bits[i] for
/// overwrite. `old_bits` and `new_bits` are gathered: entry i is the word of element
/// sorted_indices[i] (not whole tensors). Throws invalid_argument when W is not the width of
/// `type`, the three spans differ in length, the indices are not strictly increasing, or `enc`
/// is ulp (not in format version 1). Checking indices against the tensor's numel is left to the
/// encoder, which has the registry.
template <storage_word W>
[[nodiscard]] item make_item(tensor_id tensor, dtype type, encoding enc,
                             std::span<const std::uint64_t> sorted_indices,
                             std::span<const W> old_bits, std::span<const W> new_bits) {
  DCR_EXPECTS(dtype_size(type) == sizeof(W), errc::invalid_argument,
              "make_item: word of " + std::to_string(sizeof(W)) + " bytes for dtype " +
                  std::string(dtype_name(type)));
  DCR_EXPECTS(old_bits.size() == sorted_indices.size() && new_bits.size() == sorted_indices.size(),
              errc::invalid_argument,
              "make_item: " + std::to_string(sorted_indices.size()) + " indices but " +
                  std::to_string(old_bits.size()) + " old and " + std::to_string(new_bits.size()) +
                  " new words");
  DCR_EXPECTS(enc == encoding::overwrite || enc == encoding::xor_mask, errc::invalid_argument,
              "make_item: encoding " + std::to_string(static_cast<int>(enc)) +
                  " is not supported (format version 1 has overwrite and xor_mask)");
  for (std::size_t i = 1; i < sorted_indices.size(); ++i)
    DCR_EXPECTS(sorted_indices[i - 1] < sorted_indices[i], errc::invalid_argument,
                "make_item: indices not strictly increasing at position " + std::to_string(i));

  item it;
  it.tensor = tensor;
  it.type = type;
  it.enc = enc;
  it.indices.assign(sorted_indices.begin(), sorted_indices.end());
  it.values.resize(sorted_indices.size() * sizeof(W));
  auto out = it.words<W>();
  if (enc == encoding::xor_mask) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = xor_encode<W>{}(old_bits[i], new_bits[i]);
  } else if (!out.empty()) {
    std::memcpy(out.data(), new_bits.data(), new_bits.size_bytes());
  }
  return it;
}

}  // namespace dcr
