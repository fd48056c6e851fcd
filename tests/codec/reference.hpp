// An independent writer of the stream codings of docs/format.md, for the codec tests: plain,
// bit-by-bit code written from the document's formulas, not from the implementation.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dcr/codec/options.hpp"

namespace dcr_test {

using bytes_t = std::vector<std::byte>;
using dcr::location_coding;
using dcr::value_coding;

/// Packed bits, least significant first.
struct ref_bits {
  std::vector<bool> bits;
  void put(std::uint64_t v, unsigned k) {
    for (unsigned i = 0; i < k; ++i) bits.push_back(((v >> i) & 1) != 0);
  }
  [[nodiscard]] bytes_t bytes() const {
    bytes_t out((bits.size() + 7) / 8);
    for (std::size_t i = 0; i < bits.size(); ++i)
      if (bits[i]) out[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    return out;
  }
};

inline unsigned bit_length(std::uint64_t v) {
  unsigned len = 0;
  while (v != 0) {
    ++len;
    v >>= 1;
  }
  return len;
}

/// A bucket sequence: header M, symbols, extra bits.
inline bytes_t ref_buckets(const std::vector<std::uint64_t>& values, unsigned m) {
  bytes_t out = {static_cast<std::byte>(m)};
  ref_bits extra;
  for (const std::uint64_t v : values) {
    const unsigned len = bit_length(v);
    if (len <= m + 1) {
      out.push_back(static_cast<std::byte>(v));
      continue;
    }
    const unsigned e = len - 1 - m;
    const std::uint64_t mantissa = (v >> e) & ((1u << m) - 1);
    const std::uint64_t symbol = (2u << m) + (std::uint64_t{len} - m - 2) * (1u << m) + mantissa;
    REQUIRE(symbol < 256);
    out.push_back(static_cast<std::byte>(symbol));
    extra.put(v & ((std::uint64_t{1} << e) - 1), e);
  }
  const bytes_t x = extra.bytes();
  out.insert(out.end(), x.begin(), x.end());
  return out;
}

inline std::vector<std::uint64_t> skips_of(const std::vector<std::uint64_t>& idx) {
  std::vector<std::uint64_t> s;
  std::uint64_t next = 0;
  for (auto i : idx) {
    s.push_back(i - next);
    next = i + 1;
  }
  return s;
}

/// The raw location stream of `idx` in coding `c` (`m`: bucket mantissa bits).
inline bytes_t ref_locations(const std::vector<std::uint64_t>& idx, location_coding c, unsigned m) {
  bytes_t out;
  switch (c) {
    case location_coding::skip_varint:
      for (auto s : skips_of(idx)) {
        do {
          std::uint8_t b = s & 0x7f;
          s >>= 7;
          if (s != 0) b |= 0x80;
          out.push_back(static_cast<std::byte>(b));
        } while (s != 0);
      }
      return out;
    case location_coding::skip_buckets: return ref_buckets(skips_of(idx), m);
    case location_coding::bitmap:
      if (!idx.empty()) out.resize(idx.back() / 8 + 1);
      for (auto i : idx) out[i / 8] |= static_cast<std::byte>(1u << (i % 8));
      return out;
    case location_coding::runs: {
      std::vector<std::uint64_t> starts, lengths;
      for (std::size_t j = 0; j < idx.size(); ++j) {
        if (j == 0 || idx[j] != idx[j - 1] + 1) {
          starts.push_back(idx[j]);
          lengths.push_back(1);
        } else {
          ++lengths.back();
        }
      }
      std::vector<std::uint64_t> ints;
      std::uint64_t next = 0;
      for (std::size_t r = 0; r < starts.size(); ++r) {
        ints.push_back(starts[r] - next);
        next = starts[r] + lengths[r];
      }
      for (auto len : lengths) ints.push_back(len - 1);
      std::uint64_t n = starts.size();
      do {
        std::uint8_t b = n & 0x7f;
        n >>= 7;
        if (n != 0) b |= 0x80;
        out.push_back(static_cast<std::byte>(b));
      } while (n != 0);
      const bytes_t b = ref_buckets(ints, m);
      out.insert(out.end(), b.begin(), b.end());
      return out;
    }
  }
  return out;
}

/// Zigzag map: 0, -1, 1, -2, ... to 0, 1, 2, 3, ...
template <class W>
W ref_zigzag(W v) {
  using S = std::make_signed_t<W>;
  const S s = static_cast<S>(v);
  return static_cast<W>(s < 0 ? (~static_cast<W>(v)) * 2 + 1 : static_cast<W>(v) * 2);
}

/// The raw value stream of `words` in coding `c` (`m`: bucket mantissa bits).
template <class W>
bytes_t ref_values(const std::vector<W>& words, value_coding c, unsigned m) {
  const std::size_t n = words.size(), w = sizeof(W);
  bytes_t out;
  const bool zig = c == value_coding::zigzag_planes || c == value_coding::zigzag_buckets;
  std::vector<W> v = words;
  if (zig)
    for (auto& x : v) x = ref_zigzag<W>(x);
  switch (c) {
    case value_coding::raw:
      for (auto x : v)
        for (std::size_t k = 0; k < w; ++k) out.push_back(static_cast<std::byte>(x >> (8 * k)));
      return out;
    case value_coding::byte_planes:
    case value_coding::zigzag_planes:
      out.resize(n * w);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t k = 0; k < w; ++k) out[k * n + i] = static_cast<std::byte>(v[i] >> (8 * k));
      return out;
    case value_coding::buckets:
    case value_coding::zigzag_buckets: {
      std::vector<std::uint64_t> ints(v.begin(), v.end());
      return ref_buckets(ints, m);
    }
  }
  return out;
}


}  // namespace dcr_test
