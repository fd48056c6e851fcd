// dcr/detail/codec/streams.inl: the bodies of dcr/codec/streams.hpp (included at its end).
#pragma once

namespace dcr::detail {

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

DCR_INLINE std::byte* raw_stream::extend(std::size_t n) {
  if (buffer.size() < size + n)
    buffer.resize(std::max(size + n, buffer.size() + buffer.size() / 2));
  std::byte* p = buffer.data() + size;
  size += n;
  return p;
}

DCR_INLINE void raw_stream::mark() noexcept {
  if (size != 0 && break_count < max_breaks &&
      (break_count == 0 || breaks[break_count - 1] != size))
    breaks[break_count++] = size;
}

#if DCR_STREAMS_X86
DCR_INLINE bool streams_have_avx512() noexcept {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }();
  return yes;
}
#endif

DCR_INLINE std::size_t count_runs(std::span<const std::uint64_t> indices) noexcept {
  std::size_t runs = indices.empty() ? 0 : 1;
  for (std::size_t j = 1; j < indices.size(); ++j) runs += indices[j] != indices[j - 1] + 1 ? 1 : 0;
  return runs;
}

DCR_INLINE void write_locations(raw_stream& out, std::vector<std::byte>& scratch,
                                std::vector<std::byte>& run_scratch,
                                std::span<const std::uint64_t> indices, location_coding coding,
                                unsigned m, std::size_t runs) {
  out.clear();
  const std::size_t n = indices.size();
  switch (coding) {
    case location_coding::skip_varint: {
      const std::uint64_t last = n == 0 ? 0 : indices.back();
      std::byte* const begin = out.extend(n * varint_size(last));
      std::byte* p = begin;
      std::uint64_t next = 0;
      for (const std::uint64_t index : indices) {
        p = put_varint(p, index - next);
        next = index + 1;
      }
      out.size -= n * varint_size(last) - static_cast<std::size_t>(p - begin);
      return;
    }
    case location_coding::skip_buckets: {
      const std::uint64_t last = n == 0 ? 0 : indices.back();
      const auto width = static_cast<unsigned>(std::bit_width(last));
#if DCR_STREAMS_X86
      if (streams_have_avx512()) {  // the largest stream at usual change rates: vectorized
        write_buckets_with(out, scratch, n, m, width, [&](std::byte* symbols, std::byte* extra) {
          return visit_mantissa(m, [&](auto mc) {
            return write_skip_symbols_avx512<decltype(mc)::value>(indices.data(), symbols, extra,
                                                                  n);
          });
        });
        return;
      }
#endif
      // Called for j = 0, 1, ... in order, so the skip can keep the next expected index.
      write_buckets(out, scratch, n, m, width,
                    [at = indices.data(), next = std::uint64_t{0}](std::size_t j) mutable {
                      const std::uint64_t skip = at[j] - next;
                      next = at[j] + 1;
                      return skip;
                    });
      return;
    }
    case location_coding::bitmap: {
      const auto size = static_cast<std::size_t>(bitmap_size(indices));
      std::byte* p = out.extend(size);
      std::memset(p, 0, size);
      for (const std::uint64_t index : indices)
        p[index / 8] |= static_cast<std::byte>(1u << (index % 8));
      return;
    }
    case location_coding::runs: {
      put_varint(out.extend(varint_size(runs)), runs);
      const std::uint64_t last = n == 0 ? 0 : indices.back();
      const auto width = static_cast<unsigned>(std::bit_width(last));
      const std::size_t count2 = 2 * runs;
      // The walk fills 2 * runs integers (skips, then lengths minus one) in a scratch of their
      // own, then write_buckets codes them (its extra bits go to `scratch`).
      auto* ints = reinterpret_cast<std::uint64_t*>(grow_scratch(run_scratch, 8 * count2));
      std::size_t r = 0;
      std::uint64_t next = 0;
      for (std::size_t j = 0; j < n;) {
        std::size_t k = j + 1;
        while (k < n && indices[k] == indices[k - 1] + 1) ++k;
        ints[r] = indices[j] - next;
        ints[runs + r] = k - j - 1;
        ++r;
        next = indices[k - 1] + 1;
        j = k;
      }
      write_buckets(
          out, scratch, count2, m, width, [ints](std::size_t i) { return ints[i]; }, runs);
      return;
    }
  }
}

DCR_INLINE bool location_raw_size_plausible(location_coding coding, std::uint64_t raw,
                                            std::uint64_t count, std::uint64_t numel) noexcept {
  const std::uint64_t top = numel == 0 ? 0 : numel - 1;
  const auto width = static_cast<unsigned>(std::bit_width(top));
  switch (coding) {
    case location_coding::skip_varint:
      return raw >= count && raw <= count * varint_size(top);
    case location_coding::skip_buckets:
      return raw >= 1 + count &&
             raw - 1 - count <= packed_bytes(count * (width > 1 ? width - 1 : 0));
    case location_coding::bitmap:
      return (raw == 0) == (count == 0) && raw <= packed_bytes(numel) && count <= 8 * raw;
    case location_coding::runs:
      return raw >= 2 && raw <= varint_size(count) + 1 + 2 * count + packed_bytes(2 * count * 64);
  }
  return false;
}

#endif  // DCR_HEADER_BODIES

template <unsigned M, class Gen>
std::size_t write_bucket_symbols(std::byte* symbols, std::byte* extra_area, std::size_t n,
                                 Gen& gen) {
  bit_writer bits(extra_area);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    // gen is called once per record, in order (it may keep state between calls).
    const bucket_code c0 = bucket_of(gen(i), M);  // M constant: shifts by immediates
    const bucket_code c1 = bucket_of(gen(i + 1), M);
    const bucket_code c2 = bucket_of(gen(i + 2), M);
    const bucket_code c3 = bucket_of(gen(i + 3), M);
    symbols[i] = static_cast<std::byte>(c0.symbol);
    symbols[i + 1] = static_cast<std::byte>(c1.symbol);
    symbols[i + 2] = static_cast<std::byte>(c2.symbol);
    symbols[i + 3] = static_cast<std::byte>(c3.symbol);
    const unsigned k01 = c0.extra_bits + c1.extra_bits;
    const unsigned k = k01 + c2.extra_bits + c3.extra_bits;
    if (k <= 56) [[likely]] {  // every shift below is then by at most 56
      const std::uint64_t v01 = c0.extra | c1.extra << c0.extra_bits;
      const std::uint64_t v23 = c2.extra | c3.extra << c2.extra_bits;
      bits.put(v01 | v23 << k01, k);
    } else {
      bits.put(c0.extra, c0.extra_bits);
      bits.put(c1.extra, c1.extra_bits);
      bits.put(c2.extra, c2.extra_bits);
      bits.put(c3.extra, c3.extra_bits);
    }
  }
  for (; i < n; ++i) {
    const bucket_code c = bucket_of(gen(i), M);
    symbols[i] = static_cast<std::byte>(c.symbol);
    bits.put(c.extra, c.extra_bits);
  }
  return static_cast<std::size_t>(bits.finish() - extra_area);
}

#if DCR_STREAMS_X86
// GCC 12 warns -Wmaybe-uninitialized inside its own intrinsic headers (the _mm512_undefined_*
// placeholders of masked operations) when sanitizers are on: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <unsigned M>
__attribute__((target("avx512f,avx512cd,avx512bw,avx512dq"))) std::size_t write_skip_symbols_avx512(
    const std::uint64_t* indices, std::byte* symbols, std::byte* extra_area, std::size_t n) {
  bit_writer bits(extra_area);
  const auto scalar = [&](std::size_t j, std::uint64_t skip) {
    const bucket_code c = bucket_of(skip, M);
    symbols[j] = static_cast<std::byte>(c.symbol);
    bits.put(c.extra, c.extra_bits);
  };
  if (n == 0) return static_cast<std::size_t>(bits.finish() - extra_area);
  scalar(0, indices[0]);
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i m_plus_one = _mm512_set1_epi64(M + 1);
  std::size_t j = 1;
  for (; j + 8 <= n; j += 8) {
    const __m512i cur = _mm512_loadu_si512(indices + j);
    const __m512i prev = _mm512_loadu_si512(indices + j - 1);
    const __m512i skip = _mm512_sub_epi64(_mm512_sub_epi64(cur, prev), one);
    // e = max(bit_width(skip | 1) - M - 1, 0) = max(63 - lzcnt(skip | 1) - M, 0)
    const __m512i width =
        _mm512_sub_epi64(_mm512_set1_epi64(64), _mm512_lzcnt_epi64(_mm512_or_si512(skip, one)));
    // (Full-mask maskz forms throughout: GCC 12's plain forms read an uninitialized operand.)
    const __m512i e = _mm512_maskz_max_epi64(0xff, _mm512_sub_epi64(width, m_plus_one), zero);
    const __m512i symbol = _mm512_add_epi64(_mm512_maskz_srlv_epi64(0xff, skip, e),
                                            _mm512_maskz_slli_epi64(0xff, e, M));
    const __m512i extra =
        _mm512_and_si512(skip, _mm512_sub_epi64(_mm512_maskz_sllv_epi64(0xff, one, e), one));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(symbols + j),
                     _mm512_maskz_cvtepi64_epi8(0xff, symbol));
    // Inclusive prefix sum of e across the lanes, by shifts of 1, 2 and 4 lanes (zeros in).
    __m512i sum = _mm512_add_epi64(e, _mm512_maskz_alignr_epi64(0xff, e, zero, 7));
    sum = _mm512_add_epi64(sum, _mm512_maskz_alignr_epi64(0xff, sum, zero, 6));
    sum = _mm512_add_epi64(sum, _mm512_maskz_alignr_epi64(0xff, sum, zero, 4));
    const auto total =
        static_cast<unsigned>(_mm_extract_epi64(_mm512_maskz_extracti64x2_epi64(0x3, sum, 3), 1));
    if (total <= 56) [[likely]] {                   // every shift is then by at most 56
      const __m512i at = _mm512_sub_epi64(sum, e);  // exclusive prefix sum
      // The lanes' bits do not overlap: OR them together the way the sum was formed.
      __m512i joined = _mm512_maskz_sllv_epi64(0xff, extra, at);
      joined = _mm512_or_si512(joined, _mm512_maskz_alignr_epi64(0xff, joined, zero, 4));
      joined = _mm512_or_si512(joined, _mm512_maskz_alignr_epi64(0xff, joined, zero, 6));
      joined = _mm512_or_si512(joined, _mm512_maskz_alignr_epi64(0xff, joined, zero, 7));
      bits.put(static_cast<std::uint64_t>(
                   _mm_extract_epi64(_mm512_maskz_extracti64x2_epi64(0x3, joined, 3), 1)),
               total);
    } else {
      alignas(64) std::uint64_t x[8], k[8];
      _mm512_store_si512(x, extra);
      _mm512_store_si512(k, e);
      for (int q = 0; q < 8; ++q) bits.put(x[q], static_cast<unsigned>(k[q]));
    }
  }
  for (; j < n; ++j) scalar(j, indices[j] - indices[j - 1] - 1);
  return static_cast<std::size_t>(bits.finish() - extra_area);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

template <class WriteSymbols>
void write_buckets_with(raw_stream& out, std::vector<std::byte>& scratch, std::size_t n, unsigned m,
                        unsigned width, WriteSymbols&& write_symbols, std::size_t symbol_break) {
  const unsigned most_extra = width > m + 1 ? width - 1 - m : 0;
  std::byte* const extra_area =
      grow_scratch(scratch, static_cast<std::size_t>(packed_bytes(std::uint64_t{most_extra} * n)) +
                                bit_writer::slack);
  std::byte* const symbols = out.extend(1 + n) + 1;
  symbols[-1] = static_cast<std::byte>(m);
  const std::size_t symbols_at = out.size - n;
  const std::size_t extra_size = write_symbols(symbols, extra_area);
  if (symbol_break > 0 && symbol_break < n) {
    const std::size_t keep = out.size;
    out.size = symbols_at + symbol_break;
    out.mark();
    out.size = keep;
  }
  out.mark();
  std::memcpy(out.extend(extra_size), extra_area, extra_size);
}

template <class Gen>
void write_buckets(raw_stream& out, std::vector<std::byte>& scratch, std::size_t n, unsigned m,
                   unsigned width, Gen gen, std::size_t symbol_break) {
  write_buckets_with(
      out, scratch, n, m, width,
      [&](std::byte* symbols, std::byte* extra_area) {
        return visit_mantissa(m, [&](auto mc) {
          return write_bucket_symbols<decltype(mc)::value>(symbols, extra_area, n, gen);
        });
      },
      symbol_break);
}

template <class Where>
bucket_reader bucket_reader::open(std::span<const std::byte> bytes, std::uint64_t n, unsigned width,
                                  const Where& where, const char* what) {
  DCR_EXPECTS(bytes.size() >= 1 && bytes.size() - 1 >= n, errc::corrupt_payload,
              where() + ": " + what + ": " + std::to_string(bytes.size()) +
                  " bytes cannot hold the bucket header and " + std::to_string(n) + " symbols");
  const auto header = std::to_integer<unsigned>(bytes[0]);
  DCR_EXPECTS((header & ~7u) == 0, errc::reserved_bits_set,
              where() + ": " + what + ": bucket header " + std::to_string(header) +
                  " has reserved bits 3-7 set");
  const bucket_table table(header, width);
  const std::byte* symbols = bytes.data() + 1;
  std::uint64_t extra = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto s = std::to_integer<unsigned>(symbols[i]);
    DCR_EXPECTS(table.extra_bits[s] != bucket_table::invalid, errc::corrupt_payload,
                where() + ": " + what + ": symbol " + std::to_string(s) + " of entry " +
                    std::to_string(i) + " means more than " + std::to_string(width) +
                    " bits with " + std::to_string(header) + " mantissa bits");
    extra += table.extra_bits[s];
  }
  const std::uint64_t have = bytes.size() - 1 - n;
  DCR_EXPECTS(have == packed_bytes(extra), errc::corrupt_payload,
              where() + ": " + what + ": " + std::to_string(have) +
                  " bytes of extra bits, the symbols need " + std::to_string(extra) + " bits (" +
                  std::to_string(packed_bytes(extra)) + " bytes)");
  if (extra % 8 != 0) {
    const auto last = std::to_integer<unsigned>(bytes[bytes.size() - 1]);
    DCR_EXPECTS((last >> (extra % 8)) == 0, errc::reserved_bits_set,
                where() + ": " + what + ": padding bits of the last extra-bit byte not zero");
  }
  const std::byte* extra_at = symbols + n;
  return bucket_reader{table, symbols, static_cast<std::size_t>(n),
                       bit_reader(extra_at, bytes.data() + bytes.size())};
}

template <class Where>
void read_locations(location_coding coding, std::span<const std::byte> raw, std::uint64_t count,
                    std::uint64_t numel, std::uint64_t* out, const Where& where) {
  const auto index_error = [&](std::uint64_t j, std::uint64_t next, std::uint64_t skip) {
    return where() + ": record " + std::to_string(j) + " index " +
           (skip > ~next ? std::string("beyond 2^64") : std::to_string(next + skip)) +
           " >= numel " + std::to_string(numel);
  };
  switch (coding) {
    case location_coding::skip_varint: {
      const std::byte* p = raw.data();
      const std::byte* const end = p + raw.size();
      std::uint64_t next = 0;
      for (std::uint64_t j = 0; j < count; ++j) {
        std::uint64_t skip = 0;
        DCR_EXPECTS(get_varint(p, end, skip), errc::corrupt_payload,
                    where() + ": invalid varint for record " + std::to_string(j) +
                        " in the location stream");
        DCR_EXPECTS(skip < numel - next, errc::out_of_range, index_error(j, next, skip));
        out[j] = next + skip;
        next += skip + 1;
      }
      DCR_EXPECTS(
          p == end, errc::corrupt_payload,
          where() + ": " + std::to_string(end - p) + " bytes left over in the location stream");
      return;
    }
    case location_coding::skip_buckets: {
      auto r = bucket_reader::open(raw, count, 64, where, "location stream (skip_buckets)");
      std::uint64_t next = 0;
      for (std::uint64_t j = 0; j < count; ++j) {
        const std::uint64_t skip = r.next(static_cast<std::size_t>(j));
        DCR_EXPECTS(skip < numel - next, errc::out_of_range, index_error(j, next, skip));
        out[j] = next + skip;
        next += skip + 1;
      }
      return;
    }
    case location_coding::bitmap: {
      const std::size_t size = raw.size();
      DCR_EXPECTS(size <= packed_bytes(numel), errc::out_of_range,
                  where() + ": bitmap of " + std::to_string(size) +
                      " bytes covers more than numel " + std::to_string(numel));
      if (size == 0) {
        DCR_EXPECTS(count == 0, errc::corrupt_payload,
                    where() + ": empty bitmap for " + std::to_string(count) + " records");
        return;
      }
      const auto last = std::to_integer<unsigned>(raw[size - 1]);
      DCR_EXPECTS(last != 0, errc::corrupt_payload,
                  where() +
                      ": bitmap ends in a zero byte (it must end at the byte of the last "
                      "record)");
      const std::uint64_t top_bit =
          8 * (size - 1) + static_cast<unsigned>(std::bit_width(last)) - 1;
      DCR_EXPECTS(top_bit < numel, errc::out_of_range,
                  where() + ": bitmap bit " + std::to_string(top_bit) + " set, >= numel " +
                      std::to_string(numel));
      std::uint64_t ones = 0;
      std::size_t k = 0;
      for (; k + 8 <= size; k += 8)
        ones += static_cast<unsigned>(std::popcount(load_le<std::uint64_t>(raw.data() + k)));
      for (; k < size; ++k)
        ones += static_cast<unsigned>(std::popcount(std::to_integer<unsigned>(raw[k])));
      DCR_EXPECTS(ones == count, errc::corrupt_payload,
                  where() + ": bitmap has " + std::to_string(ones) + " bits set for " +
                      std::to_string(count) + " records");
      std::uint64_t j = 0;
      k = 0;
      for (; k + 8 <= size; k += 8) {
        std::uint64_t w = load_le<std::uint64_t>(raw.data() + k);
        while (w != 0) {
          out[j++] = 8 * k + static_cast<unsigned>(std::countr_zero(w));
          w &= w - 1;
        }
      }
      for (; k < size; ++k) {
        unsigned b = std::to_integer<unsigned>(raw[k]);
        while (b != 0) {
          out[j++] = 8 * k + static_cast<unsigned>(std::countr_zero(b));
          b &= b - 1;
        }
      }
      return;
    }
    case location_coding::runs: {
      std::size_t pos = 0;
      const std::byte* p = raw.data();
      std::uint64_t runs = 0;
      DCR_EXPECTS(get_varint(p, raw.data() + raw.size(), runs), errc::corrupt_payload,
                  where() + ": invalid varint run count in the location stream");
      pos = static_cast<std::size_t>(p - raw.data());
      DCR_EXPECTS(runs <= count && (runs == 0) == (count == 0), errc::corrupt_payload,
                  where() + ": " + std::to_string(runs) + " runs for " + std::to_string(count) +
                      " records");
      auto r = bucket_reader::open(raw.subspan(pos), 2 * runs, 64, where, "location stream (runs)");
      // The stream holds all skips, then all lengths. Decode the skips into the tail of `out`
      // (out[count - runs ...]), then place each run in front of the skips not yet used.
      std::uint64_t* skips = out + (count - runs);
      for (std::uint64_t j = 0; j < runs; ++j) skips[j] = r.next(static_cast<std::size_t>(j));
      std::uint64_t next = 0, written = 0;
      for (std::uint64_t j = 0; j < runs; ++j) {
        const std::uint64_t skip = skips[j];
        const std::uint64_t length_minus_one = r.next(static_cast<std::size_t>(runs + j));
        DCR_EXPECTS(j == 0 || skip != 0, errc::corrupt_payload,
                    where() + ": run " + std::to_string(j) + " starts where run " +
                        std::to_string(j - 1) + " ends (runs must be maximal)");
        DCR_EXPECTS(skip < numel - next, errc::out_of_range,
                    where() + ": run " + std::to_string(j) + " starts at or beyond numel " +
                        std::to_string(numel));
        const std::uint64_t start = next + skip;
        DCR_EXPECTS(length_minus_one < numel - start, errc::out_of_range,
                    where() + ": run " + std::to_string(j) + " at " + std::to_string(start) +
                        " runs past numel " + std::to_string(numel));
        DCR_EXPECTS(length_minus_one < count - written - (runs - 1 - j), errc::corrupt_payload,
                    where() + ": runs hold more than " + std::to_string(count) + " records");
        // Runs are written in increasing order; the skips not yet used sit at or after
        // out[count - runs + j + 1] >= out[written + length], so writing never overwrites them.
        for (std::uint64_t k = 0; k <= length_minus_one; ++k) out[written + k] = start + k;
        written += length_minus_one + 1;
        next = start + length_minus_one + 1;
      }
      DCR_EXPECTS(written == count, errc::corrupt_payload,
                  where() + ": runs hold " + std::to_string(written) + " records, the entry says " +
                      std::to_string(count));
      return;
    }
  }
  throw error(errc::unsupported_version, where() + ": location coding " +
                                             std::to_string(static_cast<int>(coding)) +
                                             " is not supported");
}

template <storage_word W>
void words_to_le(const std::byte* words, std::size_t n, std::byte* out) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(out, words, n * sizeof(W));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      W w;
      std::memcpy(&w, words + i * sizeof(W), sizeof(W));
      store_le<W>(out + i * sizeof(W), w);
    }
  }
}

template <storage_word W>
void le_to_words(const std::byte* in, std::size_t n, std::byte* words) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(words, in, n * sizeof(W));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const W w = load_le<W>(in + i * sizeof(W));
      std::memcpy(words + i * sizeof(W), &w, sizeof(W));
    }
  }
}

template <storage_word W, bool Zig>
void split_byte_planes(const std::byte* words, std::size_t n, std::byte* planes) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    W w;
    std::memcpy(&w, words + i * sizeof(W), sizeof(W));
    split_into_planes<W, Zig>(w, i, n, planes);
  }
}

template <storage_word W, bool Zig>
void join_byte_planes(const std::byte* planes, std::size_t n, std::byte* words) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    W w = 0;
    for (std::size_t k = 0; k < sizeof(W); ++k)
      w = static_cast<W>(w | std::to_integer<W>(planes[k * n + i]) << (8 * k));
    if constexpr (Zig) w = zigzag_decode<W>(w);
    std::memcpy(words + i * sizeof(W), &w, sizeof(W));
  }
}

template <storage_word W>
void write_values(raw_stream& out, std::vector<std::byte>& scratch, const std::byte* words,
                  std::size_t n, value_coding coding, unsigned m, unsigned width) {
  out.clear();
  const auto word = [words](std::size_t i) {
    W w;
    std::memcpy(&w, words + i * sizeof(W), sizeof(W));
    return w;
  };
  switch (coding) {
    case value_coding::raw:
      words_to_le<W>(words, n, out.extend(n * sizeof(W)));
      return;
    case value_coding::byte_planes:
    case value_coding::zigzag_planes: {
      std::byte* p = out.extend(n * sizeof(W));
      if (coding == value_coding::byte_planes)
        split_byte_planes<W, false>(words, n, p);
      else
        split_byte_planes<W, true>(words, n, p);
      for (std::size_t k = 1; k < sizeof(W); ++k) {
        const std::size_t keep = out.size;
        out.size = k * n;
        out.mark();
        out.size = keep;
      }
      return;
    }
    case value_coding::buckets:
      write_buckets(out, scratch, n, m, width,
                    [word](std::size_t i) { return std::uint64_t{word(i)}; });
      return;
    case value_coding::zigzag_buckets:
      write_buckets(out, scratch, n, m, width,
                    [word](std::size_t i) { return std::uint64_t{zigzag_encode<W>(word(i))}; });
      return;
  }
}

template <storage_word W, class Where>
void read_values(value_coding coding, std::span<const std::byte> raw, std::size_t count,
                 std::byte* out, const Where& where) {
  switch (coding) {
    case value_coding::raw:
      le_to_words<W>(raw.data(), count, out);
      return;
    case value_coding::byte_planes:
      join_byte_planes<W, false>(raw.data(), count, out);
      return;
    case value_coding::zigzag_planes:
      join_byte_planes<W, true>(raw.data(), count, out);
      return;
    case value_coding::buckets:
    case value_coding::zigzag_buckets: {
      auto r = bucket_reader::open(raw, count, 8 * sizeof(W), where, "value stream");
      const bool zig = coding == value_coding::zigzag_buckets;
      for (std::size_t i = 0; i < count; ++i) {
        auto w = static_cast<W>(r.next(i));
        if (zig) w = zigzag_decode<W>(w);
        std::memcpy(out + i * sizeof(W), &w, sizeof(W));
      }
      return;
    }
  }
  throw error(
      errc::unsupported_version,
      where() + ": value coding " + std::to_string(static_cast<int>(coding)) + " is not supported");
}

}  // namespace dcr::detail
