// dcr/detail/codec/encode_item.inl: the bodies of dcr/codec/encode_item.hpp (included at its end).
#pragma once

namespace dcr {

template <storage_word W>
encoding encode_gathered_item(item& it, std::span<const W> new_words, encoding_policy policy,
                              bool delta_permitted, const codec_options& options) {
  DCR_EXPECTS(dtype_size(it.type) == sizeof(W), errc::invalid_argument,
              "encode_gathered_item: word of " + std::to_string(sizeof(W)) + " bytes for dtype " +
                  std::string(dtype_name(it.type)) + " (tensor " + std::to_string(it.tensor) + ")");
  const std::size_t count = it.count();
  DCR_EXPECTS(
      it.values.size() == count * sizeof(W) && new_words.size() == count, errc::invalid_argument,
      "encode_gathered_item: tensor " + std::to_string(it.tensor) + " has " +
          std::to_string(count) + " indices but " + std::to_string(it.values.size() / sizeof(W)) +
          " old and " + std::to_string(new_words.size()) + " new words");
  const std::span<W> words = it.words<W>();  // the old words, overwritten by the values
  const std::span<const W> old_words(words.data(), count);
  it.enc = choose_encoding<W>(policy, delta_permitted, old_words, new_words, options);
  encode_words<W>(it.enc, old_words, new_words, words);
  return it.enc;
}

}  // namespace dcr
