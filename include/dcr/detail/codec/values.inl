// dcr/detail/codec/values.inl: the bodies of dcr/codec/values.hpp (included at its end).
#pragma once

namespace dcr {

template <storage_word W>
item make_item(tensor_id tensor, dtype type, encoding enc,
               std::span<const std::uint64_t> sorted_indices, std::span<const W> old_bits,
               std::span<const W> new_bits) {
  DCR_EXPECTS(dtype_size(type) == sizeof(W), errc::invalid_argument,
              "make_item: word of " + std::to_string(sizeof(W)) + " bytes for dtype " +
                  std::string(dtype_name(type)));
  DCR_EXPECTS(old_bits.size() == sorted_indices.size() && new_bits.size() == sorted_indices.size(),
              errc::invalid_argument,
              "make_item: " + std::to_string(sorted_indices.size()) + " indices but " +
                  std::to_string(old_bits.size()) + " old and " + std::to_string(new_bits.size()) +
                  " new words");
  DCR_EXPECTS(is_supported_encoding(enc), errc::invalid_argument,
              "make_item: encoding " + std::to_string(static_cast<int>(enc)) +
                  " is not supported (overwrite, xor_mask and ulp are)");
  for (std::size_t i = 1; i < sorted_indices.size(); ++i)
    DCR_EXPECTS(sorted_indices[i - 1] < sorted_indices[i], errc::invalid_argument,
                "make_item: indices not strictly increasing at position " + std::to_string(i));

  item it;
  it.tensor = tensor;
  it.type = type;
  it.enc = enc;
  it.indices.assign(sorted_indices.begin(), sorted_indices.end());
  it.values.resize(sorted_indices.size() * sizeof(W));
  encode_words<W>(enc, old_bits, new_bits, it.words<W>());
  return it;
}

}  // namespace dcr
