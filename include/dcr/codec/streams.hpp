// dcr/codec/streams.hpp: the raw (decompressed) content of location and value streams, for every
// coding of docs/format.md: writers for the encoder, validating readers for the decoder.
//
// Writers fill a grow-only raw_stream (no allocation once warm) and mark where its sections start,
// so that the compressor can give each section its own zstd block (and Huffman table). Readers
// take exactly the bytes a stream decompressed to and either produce the item's indices or words
// or throw dcr::error naming the record and what is wrong, checking every field against the bytes
// and the tensor before using it. Everything works on stored words with integer operations only.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/codec/options.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/config.hpp"
#include "dcr/detail/bitpack.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__)
#define DCR_STREAMS_X86 1
#include <immintrin.h>
#else
#define DCR_STREAMS_X86 0
#endif

namespace dcr::detail {

// ============================================================================ word transforms

// zigzag_encode / zigzag_decode: dcr/codec/values.hpp (shared with the device encode helpers).

// ============================================================================ bucket sequences
//
// A bucket sequence codes n unsigned integers of at most B bits as a header byte (M, the
// mantissa bits, 0..7), n one-byte symbols and the packed extra bits. An integer v of bit length
// L (0 for v = 0) has symbol v itself when L <= M + 1 (no extra bits); otherwise symbol
// 2^(M+1) + (L - M - 2) * 2^M + (the M bits below v's leading one), and its L - 1 - M lowest bits
// are extra bits. The symbol carries magnitude and leading bits, which is what a Huffman stage
// compresses; the extra bits are close to uniform and are stored packed.

/// Largest bit length a one-byte symbol can carry with `m` mantissa bits (capped at 64).
constexpr unsigned bucket_max_width(unsigned m) noexcept {
  const unsigned w = m + (256u >> m) - 1;
  return w > 64 ? 64 : w;
}

/// Mantissa bits an encoder may use (the format allows up to 7).
inline constexpr unsigned bucket_max_mantissa = 4;

struct bucket_code {
  std::uint32_t symbol;
  std::uint32_t extra_bits;
  std::uint64_t extra;
};

/// The symbol and extra bits of `v` with `m` mantissa bits; the caller ensures bit_width(v) <=
/// bucket_max_width(m). Branch-free: with e = max(0, L - 1 - m) extra bits, the symbol is
/// (v >> e) + e * 2^m, which is v itself when e = 0 and the formula above otherwise.
DCR_HOST_DEVICE constexpr bucket_code bucket_of(std::uint64_t v, unsigned m) noexcept {
  // bit_width(v | 1) differs from bit_width(v) only for v = 0, where both give e = 0, and it
  // spares the compiler a branch for a zero argument.
  const int d = static_cast<int>(std::bit_width(v | 1u)) - static_cast<int>(m) - 1;
  const auto e = static_cast<unsigned>(d & ~(d >> 31));  // max(d, 0) without a branch
  return {static_cast<std::uint32_t>((v >> e) + (std::uint64_t{e} << m)), e,
          v & ((std::uint64_t{1} << e) - 1)};
}

/// What each symbol means for one M and one width bound B: base value and extra bit count;
/// extra_bits 0xff marks a symbol whose bit length exceeds B (invalid).
struct bucket_table {
  std::array<std::uint64_t, 256> base{};
  std::array<std::uint8_t, 256> extra_bits{};

  static constexpr std::uint8_t invalid = 0xff;

  constexpr bucket_table(unsigned m, unsigned width) noexcept {
    for (unsigned s = 0; s < 256; ++s) {
      if (s < (2u << m)) {
        base[s] = s;
        extra_bits[s] = std::bit_width(s) <= width ? 0 : invalid;
        continue;
      }
      const unsigned t = s - (2u << m);
      const unsigned len = m + 2 + (t >> m);
      if (len > width) {
        extra_bits[s] = invalid;
        continue;
      }
      const unsigned extra = len - 1 - m;
      base[s] = (std::uint64_t{(1u << m) | (t & ((1u << m) - 1))}) << extra;
      extra_bits[s] = static_cast<std::uint8_t>(extra);
    }
  }
};

// ============================================================================ raw streams

/// The raw content of one stream being built: a grow-only byte buffer (so a warm encoder does
/// not allocate or zero-fill), its used size, and the offsets where sections after the first
/// start.
struct raw_stream {
  static constexpr std::size_t max_breaks = 10;

  std::vector<std::byte> buffer;
  std::size_t size = 0;
  std::array<std::size_t, max_breaks> breaks{};
  std::size_t break_count = 0;

  void clear() noexcept {
    size = 0;
    break_count = 0;
  }
  /// Room for `n` more bytes after `size`; returns where they start.
  std::byte* extend(std::size_t n);
  /// A new section starts at the current size.
  void mark() noexcept;
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {buffer.data(), size}; }
  [[nodiscard]] std::span<const std::size_t> sections() const noexcept {
    return {breaks.data(), break_count};
  }
};

/// Grow-only scratch for packed extra bits.
inline std::byte* grow_scratch(std::vector<std::byte>& scratch, std::size_t n) {
  if (scratch.size() < n) scratch.resize(std::max(n, scratch.size() + scratch.size() / 2));
  return scratch.data();
}

/// The symbols and packed extra bits of gen(0), gen(1), ... with M mantissa bits; returns the
/// bytes of extra bits written.
// Four records at a time: their extra bits are joined in a register and written with one put
// whenever together they fit in 56 bits (nearly always), which cuts the bit writer's serial
// dependency chain, the loop's bottleneck, to a quarter. The bits are the same either way.
template <unsigned M, class Gen>
std::size_t write_bucket_symbols(std::byte* symbols, std::byte* extra_area, std::size_t n,
                                 Gen& gen);

/// Calls f(std::integral_constant<unsigned, M>{}) for the run-time mantissa bits m (0..7).
template <class F>
decltype(auto) visit_mantissa(unsigned m, F&& f) {
  switch (m) {
    case 0: return f(std::integral_constant<unsigned, 0>{});
    case 1: return f(std::integral_constant<unsigned, 1>{});
    case 2: return f(std::integral_constant<unsigned, 2>{});
    case 3: return f(std::integral_constant<unsigned, 3>{});
    case 4: return f(std::integral_constant<unsigned, 4>{});
    case 5: return f(std::integral_constant<unsigned, 5>{});
    case 6: return f(std::integral_constant<unsigned, 6>{});
    default: return f(std::integral_constant<unsigned, 7>{});
  }
}

#if DCR_STREAMS_X86
/// Whether this CPU runs write_skip_symbols_avx512 (AVX-512 F, CD, BW, DQ).
bool streams_have_avx512() noexcept;

/// write_bucket_symbols<M> over the skips of strictly increasing `indices` (index - previous
/// index - 1, the first one's is its index), eight records per step: skips, bit lengths,
/// symbols and extra bits in vector lanes, and the eight records' extra bits joined (exclusive
/// prefix sum of their lengths, shifts, OR) and written with one put whenever together they fit
/// in 56 bits. The same bytes as the scalar loop, about four times as fast.
template <unsigned M>
__attribute__((target("avx512f,avx512cd,avx512bw,avx512dq"))) std::size_t
write_skip_symbols_avx512(const std::uint64_t* indices, std::byte* symbols, std::byte* extra_area,
                          std::size_t n);
#endif

/// Appends a bucket sequence of `n` integers, each of at most `width` bits, with `m` mantissa
/// bits (bucket_max_width(m) >= width), whose symbols and packed extra bits
/// write_symbols(symbols, extra_area) writes (returning the bytes of extra bits). Sections:
/// header and symbols, then extra bits; when `symbol_break` is in (0, n), a section also starts
/// at that symbol.
template <class WriteSymbols>
void write_buckets_with(raw_stream& out, std::vector<std::byte>& scratch, std::size_t n,
                        unsigned m, unsigned width, WriteSymbols&& write_symbols,
                        std::size_t symbol_break = 0);

/// Appends a bucket sequence of `n` integers gen(0), gen(1), ... (called once each, in that
/// order), each of at most `width` bits, with `m` mantissa bits (bucket_max_width(m) >= width).
/// Sections: header and symbols, then extra bits; when `symbol_break` is in (0, n), a section
/// also starts at that symbol.
template <class Gen>
void write_buckets(raw_stream& out, std::vector<std::byte>& scratch, std::size_t n, unsigned m,
                   unsigned width, Gen gen, std::size_t symbol_break = 0);

/// Reads a bucket sequence of `n` integers of at most `width` bits that fills a stream's bytes.
struct bucket_reader {
  bucket_table table;
  const std::byte* symbols;
  std::size_t n;
  bit_reader bits;

  /// Validates the sequence before anything is read from it: reserved header bits zero
  /// (reserved_bits_set), every symbol valid for M and `width` (corrupt_payload), the extra-bit
  /// section exactly as long as the symbols require (corrupt_payload) and its padding bits zero
  /// (reserved_bits_set). `what` names the stream in messages.
  template <class Where>
  static bucket_reader open(std::span<const std::byte> bytes, std::uint64_t n, unsigned width,
                            const Where& where, const char* what);

  /// Integer i (called for i = 0, 1, ... in order).
  DCR_FORCE_INLINE std::uint64_t next(std::size_t i) noexcept {
    const auto s = std::to_integer<unsigned>(symbols[i]);
    return table.base[s] | bits.get(table.extra_bits[s]);
  }
};

// ============================================================================ locations

/// Number of maximal runs of consecutive indices in a strictly increasing sequence.
std::size_t count_runs(std::span<const std::uint64_t> indices) noexcept;

/// Bytes of a bitmap stream for strictly increasing `indices`.
inline std::uint64_t bitmap_size(std::span<const std::uint64_t> indices) noexcept {
  return indices.empty() ? 0 : indices.back() / 8 + 1;
}

/// Whether an encoder may use bitmap (at least one record per 16 elements up to the last) and
/// runs (at most one run per two records) for an item: keeps every stream's raw size within
/// location_raw_bound(count).
inline bool bitmap_eligible(std::span<const std::uint64_t> indices) noexcept {
  return !indices.empty() && bitmap_size(indices) <= 2 * std::uint64_t{indices.size()};
}
inline bool runs_eligible(std::size_t count, std::size_t runs) noexcept {
  return count != 0 && 2 * runs <= count;
}

/// An upper bound of the raw location stream an encoder writes for `count` records under any
/// coding it may choose (skip_varint: 10 bytes per record; skip_buckets: 1 + 9 per record; bitmap
/// and runs only where eligible).
constexpr std::uint64_t location_raw_bound(std::uint64_t count) noexcept {
  return 16 + 10 * count;
}

/// Writes the location stream of strictly increasing `indices` in `coding` (`m`: bucket mantissa
/// bits, for skip_buckets and runs; `runs`: count_runs(indices), for runs). `scratch` and
/// `run_scratch` are grow-only work areas.
void write_locations(raw_stream& out, std::vector<std::byte>& scratch,
                     std::vector<std::byte>& run_scratch, std::span<const std::uint64_t> indices,
                     location_coding coding, unsigned m, std::size_t runs);

/// The location stream's raw size bounds for `count` records of a tensor of `numel` elements,
/// known before decompressing: false when `raw` cannot be a stream of `coding`.
bool location_raw_size_plausible(location_coding coding, std::uint64_t raw, std::uint64_t count,
                                 std::uint64_t numel) noexcept;

/// Decodes and validates a location stream of `coding` holding `count` records of a tensor of
/// `numel` elements into out[0..count): strictly increasing indices below numel. Throws
/// dcr::error (corrupt_payload, out_of_range or reserved_bits_set) with where() + the reason.
template <class Where>
void read_locations(location_coding coding, std::span<const std::byte> raw, std::uint64_t count,
                    std::uint64_t numel, std::uint64_t* out, const Where& where);

// ============================================================================ values

/// Writes the words (host order) in little-endian order, or as byte planes (zigzag-mapped first
/// when `zig`); and back.
template <storage_word W>
void words_to_le(const std::byte* words, std::size_t n, std::byte* out) noexcept;
template <storage_word W>
void le_to_words(const std::byte* in, std::size_t n, std::byte* words) noexcept;
template <storage_word W, bool Zig = false>
void split_byte_planes(const std::byte* words, std::size_t n, std::byte* planes) noexcept;
template <storage_word W, bool Zig = false>
void join_byte_planes(const std::byte* planes, std::size_t n, std::byte* words) noexcept;

/// Whether `coding` is a bucket sequence and whether it zigzag-maps the words first.
constexpr bool is_bucket_coding(value_coding c) noexcept {
  return c == value_coding::buckets || c == value_coding::zigzag_buckets;
}
constexpr bool is_zigzag_coding(value_coding c) noexcept {
  return c == value_coding::zigzag_planes || c == value_coding::zigzag_buckets;
}
constexpr bool is_known_value_coding(std::uint8_t code) noexcept { return code <= 4; }
constexpr bool is_known_location_coding(std::uint8_t code) noexcept { return code <= 3; }

/// An upper bound of the raw value stream for `count` words of `word` bytes under any coding.
constexpr std::uint64_t value_raw_bound(std::uint64_t count, std::uint64_t word) noexcept {
  return 1 + count * (word + 1);
}

/// Writes the value stream of `n` words (host order, at `words`) of type W in `coding` (`m`:
/// bucket mantissa bits, which must carry `width` = the bit length of the largest (mapped) word).
template <storage_word W>
void write_values(raw_stream& out, std::vector<std::byte>& scratch, const std::byte* words,
                  std::size_t n, value_coding coding, unsigned m, unsigned width);

/// The value stream's raw size bounds, known before decompressing.
constexpr bool value_raw_size_plausible(value_coding coding, std::uint64_t raw,
                                        std::uint64_t count, std::uint64_t word) noexcept {
  if (is_bucket_coding(coding))
    return raw >= 1 + count && raw - 1 - count <= packed_bytes(count * (8 * word - 1));
  return raw == count * word;
}

/// Decodes and validates a value stream of `coding` holding `count` words of type W into `out`
/// (count * sizeof(W) bytes, host order). Throws dcr::error (corrupt_payload or
/// reserved_bits_set) with where() + the reason.
template <storage_word W, class Where>
void read_values(value_coding coding, std::span<const std::byte> raw, std::size_t count,
                 std::byte* out, const Where& where);

}  // namespace dcr::detail

#include "dcr/detail/codec/streams.inl"
