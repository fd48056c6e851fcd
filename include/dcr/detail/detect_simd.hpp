// dcr/detail/detect_simd.hpp: the inner loop of change detection, per instruction set.
//
// The loop walks 64-byte blocks. For each it builds a mask with one bit per differing word
// (one AVX-512 compare, two AVX2 compares, or a portable word loop) and writes the offsets of
// the set bits, relative to the start of the call, as 16-bit values; the caller widens them to
// 64-bit indices. On AVX-512 the offsets are compacted with vpcompressw (VBMI2), 32 lanes at
// once, and stored unconditionally: the loop has no data-dependent branch, which matters because
// at a 1% change rate a quarter of BF16 blocks change, at random (a branch on "block changed"
// mispredicted often enough to halve the speed). Elsewhere a count-trailing-zeros loop emits
// them after a branch on the block.
// The instruction set is chosen once at run time, so one binary runs everywhere. Under nvcc the
// portable loop is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dcr/dtype.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__)
#define DCR_DETECT_X86 1
#include <immintrin.h>
#else
#define DCR_DETECT_X86 0
#endif

namespace dcr::detail {

/// Words one call of a detection loop may cover (offsets must fit 16 bits).
inline constexpr std::size_t detect_chunk_words = 8192;
/// Extra output slots a detection loop may write past its last offset.
inline constexpr std::size_t detect_out_slack = 32;

/// Signature of one detection loop: words [0, n) of a and b (n a multiple of 64 / sizeof(W),
/// at most detect_chunk_words); offsets of differing words written to out (room for n +
/// detect_out_slack); returns how many.
template <storage_word W>
using detect_loop_fn = std::size_t (*)(const W*, const W*, std::size_t, std::uint16_t*);

/// One bit per word (bit k of the result for word k) from a byte mask of a 64-byte block.
template <storage_word W>
DCR_FORCE_INLINE std::uint64_t bytes_to_word_mask(std::uint64_t m) noexcept {
  if constexpr (sizeof(W) == 1) {
    return m;
  } else {
    std::uint64_t words = 0;
    for (std::size_t k = 0; k < 64 / sizeof(W); ++k)
      words |= static_cast<std::uint64_t>(((m >> (k * sizeof(W))) &
                                           ((std::uint64_t{1} << sizeof(W)) - 1)) != 0)
               << k;
    return words;
  }
}

DCR_FORCE_INLINE std::size_t emit_offsets(std::uint64_t m, std::size_t j,
                                          std::uint16_t* out) noexcept {
  std::size_t k = 0;
  while (m != 0) {
    out[k++] = static_cast<std::uint16_t>(j + static_cast<std::size_t>(__builtin_ctzll(m)));
    m &= m - 1;
  }
  return k;
}

template <storage_word W>
std::size_t detect_loop_portable(const W* a, const W* b, std::size_t n,
                                 std::uint16_t* out) noexcept {
  constexpr std::size_t per_block = 64 / sizeof(W);
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; j += per_block) {
    std::uint64_t x[8], y[8];
    std::memcpy(x, a + j, 64);
    std::memcpy(y, b + j, 64);
    std::uint64_t any = 0;
    for (int q = 0; q < 8; ++q) any |= x[q] ^ y[q];
    if (any == 0) continue;
    std::uint64_t m = 0;
    for (std::size_t q = 0; q < per_block; ++q)
      m |= static_cast<std::uint64_t>(a[j + q] != b[j + q]) << q;
    k += emit_offsets(m, j, out + k);
  }
  return k;
}

#if DCR_DETECT_X86
template <storage_word W>
__attribute__((target("avx2,bmi"))) std::size_t detect_loop_avx2(const W* a, const W* b,
                                                                 std::size_t n,
                                                                 std::uint16_t* out) noexcept {
  constexpr std::size_t per_block = 64 / sizeof(W);
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; j += per_block) {
    const auto* pa = reinterpret_cast<const __m256i*>(a + j);
    const auto* pb = reinterpret_cast<const __m256i*>(b + j);
    const __m256i e0 = _mm256_cmpeq_epi8(_mm256_loadu_si256(pa), _mm256_loadu_si256(pb));
    const __m256i e1 = _mm256_cmpeq_epi8(_mm256_loadu_si256(pa + 1), _mm256_loadu_si256(pb + 1));
    const std::uint64_t eq =
        static_cast<std::uint32_t>(_mm256_movemask_epi8(e0)) |
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm256_movemask_epi8(e1))) << 32);
    if (eq == ~std::uint64_t{0}) continue;
    k += emit_offsets(bytes_to_word_mask<W>(~eq), j, out + k);
  }
  return k;
}

template <storage_word W>
__attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt"))) std::size_t detect_loop_avx512(
    const W* a, const W* b, std::size_t n, std::uint16_t* out) noexcept {
  constexpr std::size_t per_block = 64 / sizeof(W);
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
                                        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1,
                                        0);
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; j += per_block) {
    const __m512i va = _mm512_loadu_si512(a + j);
    const __m512i vb = _mm512_loadu_si512(b + j);
    std::uint64_t m;
    if constexpr (sizeof(W) == 1) m = _mm512_cmpneq_epi8_mask(va, vb);
    else if constexpr (sizeof(W) == 2) m = _mm512_cmpneq_epi16_mask(va, vb);
    else if constexpr (sizeof(W) == 4) m = _mm512_cmpneq_epi32_mask(va, vb);
    else m = _mm512_cmpneq_epi64_mask(va, vb);
    for (std::size_t g = 0; g < (per_block + 31) / 32; ++g) {
      const auto sub = static_cast<__mmask32>(m >> (32 * g));
      const __m512i offsets =
          _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(j + 32 * g)), iota);
      _mm512_storeu_si512(out + k, _mm512_maskz_compress_epi16(sub, offsets));
      k += static_cast<std::size_t>(__builtin_popcount(sub));
    }
  }
  return k;
}
#endif

/// The fastest loop this CPU supports (resolved once).
template <storage_word W>
detect_loop_fn<W> best_detect_loop() noexcept {
#if DCR_DETECT_X86
  static const detect_loop_fn<W> chosen = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi2"))
      return &detect_loop_avx512<W>;
    if (__builtin_cpu_supports("avx2")) return &detect_loop_avx2<W>;
    return &detect_loop_portable<W>;
  }();
  return chosen;
#else
  return &detect_loop_portable<W>;
#endif
}

}  // namespace dcr::detail
