// dcr/detail/apply/record.inl: the bodies of dcr/apply/record.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

namespace detail {

DCR_INLINE void prefetch_for_write(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 1);
#else
  (void)p;
#endif
}

}  // namespace detail

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
