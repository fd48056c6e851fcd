// benchmarks/codec_workloads.hpp: the synthetic workloads of the codec benchmarks and the
// baselines dcr's codec is measured against (shared by codec_report and bench_codec).
//
// Workloads (BF16 words, drawn with dcr::sim::rng, so every run with one seed sees the same data):
//   - table2: the paper's Table 2 protocol. Values drawn as FP32 N(0,1), rounded to BF16 (round
//     to nearest even); the update adds FP32 noise a * N(0,1) to each value and rounds again.
//   - stress: the paper's stress protocol. x ~ N(0,1) in BF16; exactly round(r * N) distinct
//     elements chosen uniformly get x' = bf16(x * (1 + 0.01 z)), z ~ N(0,1), in FP32 (some of them
//     round back to the same word and do not change).
//
// Baselines, written here independently of dcr's codec (only zstd's plain C API is shared):
//   - paper_style: what the paper's code ships: xor masks (old ^ new) of the changed words as a
//     little-endian u16 array, and their locations as u16 gaps (index - previous index, the
//     previous index of the first record being -1) where a gap >= 0xffff is written as the escape
//     word 0xffff followed by the gap as a u32 (low u16, high u16); each stream one zstd call.
//   - sparse_int32: int32 indices plus the new words (overwrite), each stream one zstd call (the
//     sparse-sync style of RL frameworks that send changed indices and values).
//   - dense_xor: xor of the whole tensor, one zstd call.
// Each has a decoder used to check that it round-trips, so the byte counts compared are honest.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcr/dtype.hpp"
#include "dcr/sim/random.hpp"

namespace dcr::bench {

// ---------------------------------------------------------------------------------------------
// Random numbers

/// Standard normal deviates from dcr::sim::rng by Box-Muller, using both outputs of each pair
/// (twice as fast as sim::rng::normal, same exact distribution).
class normal_source {
 public:
  explicit normal_source(std::uint64_t seed) noexcept : rng_(seed) {}

  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - rng_.uniform();  // (0, 1]
    const double u2 = rng_.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

  /// Uniform integer in [0, n) (multiply-high; bias below 2^-32 for n < 2^32).
  std::uint64_t below(std::uint64_t n) noexcept {
    __extension__ using u128 = unsigned __int128;
    return static_cast<std::uint64_t>((static_cast<u128>(rng_.next()) * n) >> 64);
  }

 private:
  sim::rng rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

/// x drawn as FP32 N(0,1), rounded to BF16.
inline void fill_normal_bf16(std::span<std::uint16_t> out, std::uint64_t seed) {
  normal_source src(seed);
  for (auto& w : out) w = float_to_bf16(static_cast<float>(src.next()));
}

/// Table 2 update: new = bf16(float(old) + a * z) in FP32, z ~ N(0,1), for every element.
inline void table2_update(std::span<const std::uint16_t> old_words, double a,
                          std::span<std::uint16_t> new_words, std::uint64_t seed) {
  normal_source src(seed);
  const auto af = static_cast<float>(a);
  for (std::size_t i = 0; i < old_words.size(); ++i)
    new_words[i] = float_to_bf16(bf16_to_float(old_words[i]) + af * static_cast<float>(src.next()));
}

/// Stress update: copies old into new, then picks exactly round(rate * n) distinct elements
/// uniformly and sets new = bf16(old * (1 + 0.01 z)) in FP32. `chosen` is scratch (one bit per
/// element). Returns the number of elements picked (not all of them change).
inline std::size_t stress_update(std::span<const std::uint16_t> old_words, double rate,
                                 std::span<std::uint16_t> new_words, std::uint64_t seed,
                                 std::vector<std::uint64_t>& chosen) {
  const std::size_t n = old_words.size();
  std::memcpy(new_words.data(), old_words.data(), n * sizeof(std::uint16_t));
  chosen.assign((n + 63) / 64, 0);
  const auto picks = static_cast<std::size_t>(std::llround(rate * static_cast<double>(n)));
  normal_source src(seed);
  for (std::size_t k = 0; k < picks;) {
    const std::uint64_t i = src.below(n);
    std::uint64_t& bits = chosen[i / 64];
    const std::uint64_t bit = std::uint64_t{1} << (i % 64);
    if ((bits & bit) != 0) continue;
    bits |= bit;
    const float z = static_cast<float>(src.next());
    new_words[i] = float_to_bf16(bf16_to_float(old_words[i]) * (1.0f + 0.01f * z));
    ++k;
  }
  return picks;
}

// ---------------------------------------------------------------------------------------------
// Statistics

/// Order-preserving key of a BF16 word (sign-magnitude to unsigned order); written here
/// independently of dcr's ulp encoding.
constexpr std::uint16_t bf16_order_key(std::uint16_t w) noexcept {
  return (w & 0x8000u) != 0 ? static_cast<std::uint16_t>(~w) : static_cast<std::uint16_t>(w | 0x8000u);
}

/// Histogram of 16-bit symbols and its order-0 entropy.
struct histogram16 {
  std::vector<std::uint64_t> counts = std::vector<std::uint64_t>(65536, 0);
  std::uint64_t total = 0;
  void add(std::uint16_t s) noexcept {
    ++counts[s];
    ++total;
  }
  /// Total order-0 entropy in bits: sum over symbols of -c * log2(c / total).
  [[nodiscard]] double entropy_bits() const noexcept {
    double bits = 0;
    const auto t = static_cast<double>(total);
    for (const std::uint64_t c : counts)
      if (c != 0) bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / t);
    return bits;
  }
};

/// Binary entropy H2(p) in bits.
inline double binary_entropy(double p) noexcept {
  if (p <= 0 || p >= 1) return 0;
  return -p * std::log2(p) - (1 - p) * std::log2(1 - p);
}

// ---------------------------------------------------------------------------------------------
// zstd, plain

/// One zstd compression and one decompression context (level fixed at construction).
class plain_zstd {
 public:
  explicit plain_zstd(int level = 1) : level_(level), c_(ZSTD_createCCtx()), d_(ZSTD_createDCtx()) {
    if (c_ == nullptr || d_ == nullptr) throw std::bad_alloc();
  }
  plain_zstd(const plain_zstd&) = delete;
  plain_zstd& operator=(const plain_zstd&) = delete;
  ~plain_zstd() {
    ZSTD_freeCCtx(c_);
    ZSTD_freeDCtx(d_);
  }

  /// Compresses src into dst (which must hold ZSTD_compressBound(src_size)); returns the size.
  std::size_t compress(const void* src, std::size_t src_size, std::vector<std::byte>& dst) {
    const std::size_t bound = ZSTD_compressBound(src_size);
    if (dst.size() < bound) dst.resize(bound);
    return check(ZSTD_compressCCtx(c_, dst.data(), dst.size(), src, src_size, level_));
  }
  /// Decompresses one frame of `size` bytes into dst (exactly `raw` bytes expected).
  void decompress(const std::byte* src, std::size_t size, void* dst, std::size_t raw) {
    const std::size_t n = check(ZSTD_decompressDCtx(d_, dst, raw, src, size));
    if (n != raw) throw std::runtime_error("zstd frame decoded to an unexpected size");
  }
  /// The content size a frame records.
  static std::size_t content_size(const std::byte* src, std::size_t size) {
    const unsigned long long n = ZSTD_getFrameContentSize(src, size);
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN)
      throw std::runtime_error("zstd frame without a content size");
    return static_cast<std::size_t>(n);
  }

 private:
  static std::size_t check(std::size_t r) {
    if (ZSTD_isError(r)) throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(r));
    return r;
  }
  int level_;
  ZSTD_CCtx* c_;
  ZSTD_DCtx* d_;
};

/// Touches every page of a byte vector sized to n (so timed code never takes a first-touch fault).
inline void presize(std::vector<std::byte>& v, std::size_t n) {
  v.resize(n);
  std::memset(v.data(), 0, n);
}
template <class T>
inline void presize(std::vector<T>& v, std::size_t n) {
  v.resize(n);
  std::fill(v.begin(), v.end(), T{});
}

// ---------------------------------------------------------------------------------------------
// Baselines. Each: prepare(n, changed) sizes and touches every buffer; encode(old, new) builds
// the compressed streams and returns the total compressed bytes; decode(old, out) rebuilds the
// new words from old and the streams (out.size() == old.size()).

/// The paper's coding: xor masks + u16 gaps with escape, zstd per stream.
class paper_style {
 public:
  static constexpr std::uint16_t escape = 0xffff;

  explicit paper_style(int level = 1) : zstd_(level) {}

  void prepare(std::size_t n, std::size_t changed) {
    presize(masks_, changed);
    presize(gaps_, changed + 3 * (n / escape + 1));
    presize(masks_z_, ZSTD_compressBound(masks_.size() * 2));
    presize(gaps_z_, ZSTD_compressBound(gaps_.size() * 2));
  }

  std::size_t encode(std::span<const std::uint16_t> old_words,
                     std::span<const std::uint16_t> new_words) {
    if (old_words.size() > 0xffffffffu) throw std::length_error("paper_style: n >= 2^32");
    std::size_t count = 0, g = 0;
    std::uint64_t prev = ~std::uint64_t{0};  // -1: the first gap is index + 1
    for (std::size_t i = 0; i < old_words.size(); ++i) {
      const std::uint16_t x = old_words[i] ^ new_words[i];
      if (x == 0) continue;
      if (count == masks_.size()) masks_.resize(2 * count + 16);
      if (g + 3 > gaps_.size()) gaps_.resize(2 * g + 16);
      masks_[count++] = x;
      const std::uint64_t gap = i - prev;
      prev = i;
      if (gap < escape) {
        gaps_[g++] = static_cast<std::uint16_t>(gap);
      } else {
        gaps_[g++] = escape;
        gaps_[g++] = static_cast<std::uint16_t>(gap);
        gaps_[g++] = static_cast<std::uint16_t>(gap >> 16);
      }
    }
    masks_size_ = zstd_.compress(masks_.data(), count * 2, masks_z_);
    gaps_size_ = zstd_.compress(gaps_.data(), g * 2, gaps_z_);
    return masks_size_ + gaps_size_;
  }

  [[nodiscard]] std::size_t mask_bytes() const noexcept { return masks_size_; }
  [[nodiscard]] std::size_t gap_bytes() const noexcept { return gaps_size_; }

  void decode(std::span<const std::uint16_t> old_words, std::span<std::uint16_t> out) {
    const std::size_t count = plain_zstd::content_size(masks_z_.data(), masks_size_) / 2;
    const std::size_t g = plain_zstd::content_size(gaps_z_.data(), gaps_size_) / 2;
    std::vector<std::uint16_t> masks(count), gaps(g);
    zstd_.decompress(masks_z_.data(), masks_size_, masks.data(), count * 2);
    zstd_.decompress(gaps_z_.data(), gaps_size_, gaps.data(), g * 2);
    std::memcpy(out.data(), old_words.data(), old_words.size() * 2);
    std::uint64_t index = ~std::uint64_t{0};
    std::size_t p = 0;
    for (std::size_t k = 0; k < count; ++k) {
      if (p >= g) throw std::runtime_error("paper_style: gap stream too short");
      std::uint64_t gap = gaps[p++];
      if (gap == escape) {
        if (p + 2 > g) throw std::runtime_error("paper_style: truncated escape");
        gap = gaps[p] | std::uint64_t{gaps[p + 1]} << 16;
        p += 2;
      }
      index += gap;
      if (index >= out.size()) throw std::runtime_error("paper_style: index out of range");
      out[index] ^= masks[k];
    }
    if (p != g) throw std::runtime_error("paper_style: gap stream too long");
  }

 private:
  plain_zstd zstd_;
  std::vector<std::uint16_t> masks_, gaps_;
  std::vector<std::byte> masks_z_, gaps_z_;
  std::size_t masks_size_ = 0, gaps_size_ = 0;
};

/// int32 indices + new words (overwrite), zstd per stream.
class sparse_int32 {
 public:
  explicit sparse_int32(int level = 1) : zstd_(level) {}

  void prepare(std::size_t /*n*/, std::size_t changed) {
    presize(indices_, changed);
    presize(values_, changed);
    presize(indices_z_, ZSTD_compressBound(changed * 4));
    presize(values_z_, ZSTD_compressBound(changed * 2));
  }

  std::size_t encode(std::span<const std::uint16_t> old_words,
                     std::span<const std::uint16_t> new_words) {
    if (old_words.size() > 0x7fffffffu) throw std::length_error("sparse_int32: n >= 2^31");
    std::size_t count = 0;
    for (std::size_t i = 0; i < old_words.size(); ++i) {
      if (old_words[i] == new_words[i]) continue;
      if (count == indices_.size()) {
        indices_.resize(2 * count + 16);
        values_.resize(2 * count + 16);
      }
      indices_[count] = static_cast<std::int32_t>(i);
      values_[count] = new_words[i];
      ++count;
    }
    indices_size_ = zstd_.compress(indices_.data(), count * 4, indices_z_);
    values_size_ = zstd_.compress(values_.data(), count * 2, values_z_);
    return indices_size_ + values_size_;
  }

  void decode(std::span<const std::uint16_t> old_words, std::span<std::uint16_t> out) {
    const std::size_t count = plain_zstd::content_size(values_z_.data(), values_size_) / 2;
    if (plain_zstd::content_size(indices_z_.data(), indices_size_) != count * 4)
      throw std::runtime_error("sparse_int32: stream sizes disagree");
    std::vector<std::int32_t> indices(count);
    std::vector<std::uint16_t> values(count);
    zstd_.decompress(indices_z_.data(), indices_size_, indices.data(), count * 4);
    zstd_.decompress(values_z_.data(), values_size_, values.data(), count * 2);
    std::memcpy(out.data(), old_words.data(), old_words.size() * 2);
    for (std::size_t k = 0; k < count; ++k) {
      const auto i = static_cast<std::size_t>(indices[k]);
      if (i >= out.size()) throw std::runtime_error("sparse_int32: index out of range");
      out[i] = values[k];
    }
  }

 private:
  plain_zstd zstd_;
  std::vector<std::int32_t> indices_;
  std::vector<std::uint16_t> values_;
  std::vector<std::byte> indices_z_, values_z_;
  std::size_t indices_size_ = 0, values_size_ = 0;
};

/// xor of the whole tensor, one zstd call.
class dense_xor {
 public:
  explicit dense_xor(int level = 1) : zstd_(level) {}

  void prepare(std::size_t n, std::size_t /*changed*/) {
    presize(masks_, n);
    presize(z_, ZSTD_compressBound(n * 2));
  }

  std::size_t encode(std::span<const std::uint16_t> old_words,
                     std::span<const std::uint16_t> new_words) {
    const std::size_t n = old_words.size();
    if (masks_.size() < n) masks_.resize(n);
    for (std::size_t i = 0; i < n; ++i) masks_[i] = old_words[i] ^ new_words[i];
    size_ = zstd_.compress(masks_.data(), n * 2, z_);
    return size_;
  }

  void decode(std::span<const std::uint16_t> old_words, std::span<std::uint16_t> out) {
    const std::size_t n = old_words.size();
    if (plain_zstd::content_size(z_.data(), size_) != n * 2)
      throw std::runtime_error("dense_xor: frame size differs from the tensor's");
    zstd_.decompress(z_.data(), size_, out.data(), n * 2);
    for (std::size_t i = 0; i < n; ++i) out[i] ^= old_words[i];
  }

 private:
  plain_zstd zstd_;
  std::vector<std::uint16_t> masks_;
  std::vector<std::byte> z_;
  std::size_t size_ = 0;
};

}  // namespace dcr::bench
