// dcr/detail/huffman.hpp: what zstd's literal stage makes of a byte histogram (implementation
// only): the encoder's size estimates for choosing codings without compressing every candidate.
//
// zstd codes the literals of each block (up to 128 KiB) with one Huffman table of code lengths at
// most 11 bits, described in the block; a block of one repeated byte is an RLE block, and a block
// that would not shrink is stored raw. literal_cost() models that stage: per symbol its
// information content, rounded up to the whole bit a Huffman code needs at least, corrected for
// what level 1's match finder adds or saves on low-entropy sections; it tracks zstd within about
// 10% on the symbol streams and byte planes the codings produce. huffman_lengths() builds the
// actual code, for tests of the model.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace dcr::detail {

/// zstd's limit on a Huffman code length (HUF_TABLELOG_DEFAULT).
inline constexpr unsigned huffman_max_bits = 11;

/// Huffman code lengths for the 256 counts of `hist` (0 for absent symbols), limited to
/// huffman_max_bits. Returns the number of symbols present.
inline unsigned huffman_lengths(const std::array<std::uint64_t, 256>& hist,
                                std::array<std::uint8_t, 256>& lengths) noexcept {
  // Two-queue construction over the sorted leaves; parents[] records the tree.
  std::array<std::uint64_t, 512> weight{};
  std::array<std::uint16_t, 512> parent{};
  std::array<std::uint16_t, 256> symbol{};
  unsigned n = 0;
  for (unsigned s = 0; s < 256; ++s)
    if (hist[s] != 0) symbol[n++] = static_cast<std::uint16_t>(s);
  lengths.fill(0);
  if (n == 0) return 0;
  if (n == 1) {
    lengths[symbol[0]] = 1;
    return 1;
  }
  std::sort(symbol.begin(), symbol.begin() + n, [&](std::uint16_t a, std::uint16_t b) {
    return hist[a] != hist[b] ? hist[a] < hist[b] : a < b;
  });
  for (unsigned i = 0; i < n; ++i) weight[i] = hist[symbol[i]];
  unsigned leaf = 0, node = n, next = n;  // leaves [leaf, n), internal nodes [node, next)
  const auto take = [&]() -> unsigned {
    if (leaf < n && (node == next || weight[leaf] <= weight[node])) return leaf++;
    return node++;
  };
  while (next < 2 * n - 1) {
    const unsigned a = take(), b = take();
    weight[next] = weight[a] + weight[b];
    parent[a] = parent[b] = static_cast<std::uint16_t>(next);
    ++next;
  }
  // Depths from the root down (parents have higher numbers than children).
  std::array<std::uint8_t, 512> depth{};
  depth[2 * n - 2] = 0;
  for (unsigned i = 2 * n - 2; i-- > 0;) depth[i] = static_cast<std::uint8_t>(depth[parent[i]] + 1);
  // Limit lengths the simple way: clamp, then lengthen the shortest codes until Kraft holds.
  std::uint64_t kraft = 0;  // in units of 2^-max_bits
  for (unsigned i = 0; i < n; ++i) {
    const unsigned d = std::min<unsigned>(depth[i], huffman_max_bits);
    lengths[symbol[i]] = static_cast<std::uint8_t>(d);
    kraft += std::uint64_t{1} << (huffman_max_bits - d);
  }
  const std::uint64_t one = std::uint64_t{1} << huffman_max_bits;
  for (unsigned i = 0; kraft > one && i < n; ++i) {  // least frequent first
    auto& len = lengths[symbol[i]];
    while (kraft > one && len < huffman_max_bits) {
      kraft -= std::uint64_t{1} << (huffman_max_bits - len - 1);
      ++len;
    }
  }
  return n;
}

/// log2(x) for x > 0 within about 1e-5, without a library call: exponent from the bits, then
/// ln of the mantissa m in [1, 2) from the series 2 * (s + s^3/3 + s^5/5 + s^7/7 + s^9/9),
/// s = (m - 1) / (m + 1) < 1/3.
[[nodiscard]] inline double fast_log2(double x) noexcept {
  auto bits = std::bit_cast<std::uint64_t>(x);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
  const double m = std::bit_cast<double>(bits);
  const double s = (m - 1) / (m + 1), s2 = s * s;
  const double ln = 2 * s * (1 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 / 9))));
  return exponent + ln * 1.4426950408889634;
}

/// Estimated bytes zstd spends on a literal section of `total` bytes whose byte histogram,
/// measured on a sample of `sampled` of them, is `hist`: each symbol costs its information
/// content -log2(p) bits, at least 1 (a Huffman code has whole bits; this is where Huffman
/// loses most against the entropy) and at most 11 (zstd's longest code), scaled to `total`;
/// plus the table and literal-section headers of every 128 KiB block; capped at storing the
/// bytes raw. A section of one repeated byte costs a few bytes (an RLE block or one match).
/// O(256), no sorting: cheap enough to compare a dozen candidates per item.
[[nodiscard]] inline double literal_cost(const std::array<std::uint64_t, 256>& hist,
                                         std::uint64_t sampled, std::uint64_t total) noexcept {
  if (total == 0 || sampled == 0) return 0;
  const double blocks = static_cast<double>((total + (128u << 10) - 1) >> 17);
  const double log_n = fast_log2(static_cast<double>(sampled));
  double bits = 0;
  unsigned present = 0;
  for (unsigned s = 0; s < 256; ++s) {
    const std::uint64_t c = hist[s];
    if (c == 0) continue;
    ++present;
    const double len = std::clamp(log_n - fast_log2(static_cast<double>(c)), 1.0,
                                  static_cast<double>(huffman_max_bits));
    bits += static_cast<double>(c) * len;
  }
  if (present == 1) return 4 * blocks;
  // zstd level 1 (with a small hash table) lands up to 12% above this model on sections of 1.3 to
  // 3.2 bits per symbol, where short matches are frequent and cost more than the literals they
  // replace, and below it under 1.3 bits, where long runs become matches: measured on geometric
  // symbol distributions, the shape of skips and small deltas.
  const double per_symbol = bits / static_cast<double>(sampled);
  const double level1 = per_symbol < 1.3   ? 0.85 + 0.27 * std::max(0.0, per_symbol - 1.0) / 0.3
                        : per_symbol < 2.0 ? 1.12
                                           : 1 + 0.12 * std::max(0.0, 3.2 - per_symbol) / 1.2;
  const double coded =
      bits * level1 / 8 * static_cast<double>(total) / static_cast<double>(sampled);
  // Table: about 4 bits per weight (FSE-compressed weights), once per block; section header
  // and the four-stream jump table.
  const double table = (present / 2.0 + 10) * blocks;
  return std::min(coded + table, static_cast<double>(total) + 3 * blocks);
}

}  // namespace dcr::detail
