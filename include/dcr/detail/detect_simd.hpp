// dcr/detail/detect_simd.hpp: the inner loops of change detection, per instruction set.
//
// A loop walks 64-byte blocks. For each it builds a mask with one bit per differing word (one
// AVX-512 compare, two AVX2 compares, or a portable word loop) and writes the offsets of the set
// bits, relative to the start of the call, as 16-bit values; the caller widens them to 64-bit
// indices. The gathering variants also write the differing words of both inputs, in the same
// order, so that a caller gets indices, old words and new words from one pass over data still in
// registers.
//
// On AVX-512 the offsets (and gathered words) are compacted with the VBMI2/F compress
// instructions and stored unconditionally: the loop has no data-dependent branch, which matters
// because at a 1% change rate a quarter of BF16 blocks change, at random (a branch on "block
// changed" mispredicted often enough to halve the speed). Each word width keeps its compare mask
// in the mask type of its own lanes (__mmask64/32/16/8) and compresses offsets in lanes of the
// word's width before narrowing them to 16 bits: a mask is never widened to a larger mask type.
// (GCC 12 at -O1 with -fsanitize=undefined spilled a widened __mmask16 with kmovw and reloaded it
// with kmovd, so garbage upper bits produced offsets past the end.) Elsewhere a
// count-trailing-zeros loop emits them after a branch on the block.
// The instruction set is chosen once at run time, so one binary runs everywhere. Under nvcc the
// portable loops are used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dcr/config.hpp"
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
/// Extra offset slots a detection loop may write past its last offset.
inline constexpr std::size_t detect_out_slack = 32;
/// Extra word slots a gathering loop may write past its last gathered word (in each output).
inline constexpr std::size_t gather_out_slack = 64;

/// Signature of one detection loop: words [0, n) of a and b (n a multiple of 64 / sizeof(W),
/// at most detect_chunk_words); offsets of differing words written to out (room for n +
/// detect_out_slack); returns how many.
template <storage_word W>
using detect_loop_fn = std::size_t (*)(const W*, const W*, std::size_t, std::uint16_t*);

/// Signature of one gathering detection loop: as detect_loop_fn, and a[offset] / b[offset] of
/// each differing word written to old_out / new_out in the same order (room for n +
/// gather_out_slack words each).
template <storage_word W>
using gather_loop_fn = std::size_t (*)(const W* a, const W* b, std::size_t n, std::uint16_t* out,
                                       W* old_out, W* new_out);

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

// Emits the offsets j + bit of the set bits of m (and, when gathering, the words at them).
template <bool Gather, class W>
DCR_FORCE_INLINE std::size_t emit_offsets(std::uint64_t m, std::size_t j, std::uint16_t* out,
                                          const W* a, const W* b, W* old_out,
                                          W* new_out) noexcept {
  std::size_t k = 0;
  while (m != 0) {
    const std::size_t at = j + static_cast<std::size_t>(__builtin_ctzll(m));
    out[k] = static_cast<std::uint16_t>(at);
    if constexpr (Gather) {
      old_out[k] = a[at];
      new_out[k] = b[at];
    }
    ++k;
    m &= m - 1;
  }
  return k;
}

DCR_FORCE_INLINE std::size_t emit_offsets(std::uint64_t m, std::size_t j,
                                          std::uint16_t* out) noexcept {
  return emit_offsets<false, std::uint8_t>(m, j, out, nullptr, nullptr, nullptr, nullptr);
}

template <storage_word W, bool Gather>
std::size_t detect_portable_impl(const W* a, const W* b, std::size_t n, std::uint16_t* out,
                                 W* old_out, W* new_out) noexcept {
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
    k += emit_offsets<Gather>(m, j, out + k, a, b, old_out + k, new_out + k);
  }
  return k;
}

template <storage_word W>
std::size_t detect_loop_portable(const W* a, const W* b, std::size_t n,
                                 std::uint16_t* out) noexcept {
  return detect_portable_impl<W, false>(a, b, n, out, nullptr, nullptr);
}
template <storage_word W>
std::size_t detect_gather_loop_portable(const W* a, const W* b, std::size_t n, std::uint16_t* out,
                                        W* old_out, W* new_out) noexcept {
  return detect_portable_impl<W, true>(a, b, n, out, old_out, new_out);
}

#if DCR_DETECT_X86
template <storage_word W, bool Gather>
__attribute__((target("avx2,bmi"))) std::size_t detect_avx2_impl(const W* a, const W* b,
                                                                 std::size_t n, std::uint16_t* out,
                                                                 W* old_out,
                                                                 W* new_out) noexcept {
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
    k += emit_offsets<Gather>(bytes_to_word_mask<W>(~eq), j, out + k, a, b, old_out + k,
                              new_out + k);
  }
  return k;
}

template <storage_word W>
std::size_t detect_loop_avx2(const W* a, const W* b, std::size_t n, std::uint16_t* out) noexcept {
  return detect_avx2_impl<W, false>(a, b, n, out, nullptr, nullptr);
}
template <storage_word W>
std::size_t detect_gather_loop_avx2(const W* a, const W* b, std::size_t n, std::uint16_t* out,
                                    W* old_out, W* new_out) noexcept {
  return detect_avx2_impl<W, true>(a, b, n, out, old_out, new_out);
}

template <storage_word W, bool Gather>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi2,popcnt"))) std::size_t
detect_avx512_impl(
    const W* a, const W* b, std::size_t n, std::uint16_t* out, W* old_out, W* new_out) noexcept {
  constexpr std::size_t per_block = 64 / sizeof(W);
  std::size_t k = 0;
  if constexpr (sizeof(W) <= 2) {
    // Offsets in 16-bit lanes, 32 per compress: one per word (u16) or per half block (u8).
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
                                          17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                          1, 0);
    for (std::size_t j = 0; j < n; j += per_block) {
      const __m512i va = _mm512_loadu_si512(a + j);
      const __m512i vb = _mm512_loadu_si512(b + j);
      if constexpr (sizeof(W) == 1) {
        const __mmask64 m = _mm512_cmpneq_epi8_mask(va, vb);
        if constexpr (Gather) {
          _mm512_storeu_si512(old_out + k, _mm512_maskz_compress_epi8(m, va));
          _mm512_storeu_si512(new_out + k, _mm512_maskz_compress_epi8(m, vb));
        }
        const std::uint64_t bits = _cvtmask64_u64(m);
        for (std::size_t g = 0; g < 2; ++g) {
          const auto half = static_cast<std::uint32_t>(bits >> (32 * g));
          const __m512i offsets =
              _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(j + 32 * g)), iota);
          _mm512_storeu_si512(out + k, _mm512_maskz_compress_epi16(_cvtu32_mask32(half), offsets));
          k += static_cast<std::size_t>(__builtin_popcount(half));
        }
      } else {
        const __mmask32 m = _mm512_cmpneq_epi16_mask(va, vb);
        const __m512i offsets =
            _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(j)), iota);
        _mm512_storeu_si512(out + k, _mm512_maskz_compress_epi16(m, offsets));
        if constexpr (Gather) {
          _mm512_storeu_si512(old_out + k, _mm512_maskz_compress_epi16(m, va));
          _mm512_storeu_si512(new_out + k, _mm512_maskz_compress_epi16(m, vb));
        }
        k += static_cast<std::size_t>(__builtin_popcount(_cvtmask32_u32(m)));
      }
    }
  } else if constexpr (sizeof(W) == 4) {
    // Offsets compressed in 32-bit lanes under the 16-bit mask, then narrowed to 16 bits.
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (std::size_t j = 0; j < n; j += per_block) {
      const __m512i va = _mm512_loadu_si512(a + j);
      const __m512i vb = _mm512_loadu_si512(b + j);
      const __mmask16 m = _mm512_cmpneq_epi32_mask(va, vb);
      const __m512i offsets = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j)), iota);
      // (The maskz form of the narrowing: GCC 12's plain form reads an uninitialized operand.)
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + k),
          _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_compress_epi32(m, offsets)));
      if constexpr (Gather) {
        _mm512_storeu_si512(old_out + k, _mm512_maskz_compress_epi32(m, va));
        _mm512_storeu_si512(new_out + k, _mm512_maskz_compress_epi32(m, vb));
      }
      k += static_cast<std::size_t>(__builtin_popcount(_cvtmask16_u32(m)));
    }
  } else {
    // Offsets compressed in 64-bit lanes under the 8-bit mask, then narrowed to 16 bits.
    const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    for (std::size_t j = 0; j < n; j += per_block) {
      const __m512i va = _mm512_loadu_si512(a + j);
      const __m512i vb = _mm512_loadu_si512(b + j);
      const __mmask8 m = _mm512_cmpneq_epi64_mask(va, vb);
      const __m512i offsets =
          _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(j)), iota);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k),
                       _mm512_maskz_cvtepi64_epi16(0xff, _mm512_maskz_compress_epi64(m, offsets)));
      if constexpr (Gather) {
        _mm512_storeu_si512(old_out + k, _mm512_maskz_compress_epi64(m, va));
        _mm512_storeu_si512(new_out + k, _mm512_maskz_compress_epi64(m, vb));
      }
      k += static_cast<std::size_t>(__builtin_popcount(_cvtmask8_u32(m)));
    }
  }
  return k;
}

template <storage_word W>
std::size_t detect_loop_avx512(const W* a, const W* b, std::size_t n,
                               std::uint16_t* out) noexcept {
  return detect_avx512_impl<W, false>(a, b, n, out, nullptr, nullptr);
}
template <storage_word W>
std::size_t detect_gather_loop_avx512(const W* a, const W* b, std::size_t n, std::uint16_t* out,
                                      W* old_out, W* new_out) noexcept {
  return detect_avx512_impl<W, true>(a, b, n, out, old_out, new_out);
}

/// Whether this CPU runs the AVX-512 loops (AVX-512 BW, DQ and VBMI2).
inline bool detect_has_avx512() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vbmi2");
}
#endif

/// The fastest loop this CPU supports (resolved once).
template <storage_word W>
detect_loop_fn<W> best_detect_loop() noexcept {
#if DCR_DETECT_X86
  static const detect_loop_fn<W> chosen = [] {
    if (detect_has_avx512()) return &detect_loop_avx512<W>;
    if (__builtin_cpu_supports("avx2")) return &detect_loop_avx2<W>;
    return &detect_loop_portable<W>;
  }();
  return chosen;
#else
  return &detect_loop_portable<W>;
#endif
}

/// The fastest gathering loop this CPU supports (resolved once).
template <storage_word W>
gather_loop_fn<W> best_gather_loop() noexcept {
#if DCR_DETECT_X86
  static const gather_loop_fn<W> chosen = [] {
    if (detect_has_avx512()) return &detect_gather_loop_avx512<W>;
    if (__builtin_cpu_supports("avx2")) return &detect_gather_loop_avx2<W>;
    return &detect_gather_loop_portable<W>;
  }();
  return chosen;
#else
  return &detect_gather_loop_portable<W>;
#endif
}

}  // namespace dcr::detail
