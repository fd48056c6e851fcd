// dcr/detail/shape.inl: the bodies of dcr/shape.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

DCR_INLINE std::int64_t expect_numel(std::span<const std::int64_t> shape, std::size_t word_bytes,
                                     const std::string& what) {
  for (const std::int64_t e : shape)
    DCR_EXPECTS(e >= 0, errc::invalid_argument,
                what + ": shape " + shape_string(shape) + " has a negative extent");
  const std::int64_t limit = std::numeric_limits<std::int64_t>::max() /
                             static_cast<std::int64_t>(word_bytes == 0 ? 1 : word_bytes);
  const auto n = checked_numel(shape, limit);
  DCR_EXPECTS(n.has_value(), errc::overflow,
              what + ": shape " + shape_string(shape) +
                  " has more elements than a signed 64-bit count holds (at most " +
                  std::to_string(limit) + " elements of " + std::to_string(word_bytes) + " bytes)");
  return *n;
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
