// dcr/detail/apply/transform.inl: the bodies of dcr/apply/transform.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE std::string transform_name(element_transform t) {
  if (t.preserves_bits()) return "identity";
  return "cast " + std::string(dtype_name(t.from())) + "->" + std::string(dtype_name(t.to()));
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
