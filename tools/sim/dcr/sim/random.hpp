// dcr/sim/random.hpp: small, fast, seedable generators for synthetic weights and updates.
// Deterministic across platforms for a given seed (no std::*_distribution, whose output the
// standard leaves to the implementation).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace dcr::sim {

/// The splitmix64 finalizer: a bijective, well-mixing map of 64-bit words (mix64(0) == 0).
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A seed derived from `seed` and an ordered list of keys (a buffer's name hash, a step, a block
/// index, ...), for generators that must be a pure function of those coordinates instead of a
/// position in one long stream. Order-sensitive ({a, b} and {b, a} differ), and every key passes
/// through mix64 before it is folded in, so nearby keys (steps 1, 2, ...) give unrelated seeds.
/// Stable across platforms and releases: synthetic data derived from it must stay reproducible.
[[nodiscard]] constexpr std::uint64_t derive_seed(
    std::uint64_t seed, std::initializer_list<std::uint64_t> keys) noexcept {
  std::uint64_t h = mix64(seed ^ 0x243f6a8885a308d3ull);
  for (const std::uint64_t k : keys)
    h = mix64(h + 0x9e3779b97f4a7c15ull + mix64(k ^ 0x13198a2e03707344ull));
  return h;
}

/// A stable 64-bit key of a name (FNV-1a, then mix64): the identity of a synthetic buffer that
/// does not depend on where the buffer sits in any list.
[[nodiscard]] constexpr std::uint64_t name_key(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return mix64(h);
}

/// xoshiro256** seeded through splitmix64.
class rng {
 public:
  explicit rng(std::uint64_t seed) noexcept {
    for (auto& s : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Standard normal (Box-Muller, exact distribution).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Cheap approximate standard normal (Irwin-Hall of four 16-bit uniforms), for bulk
  /// synthetic weights where the exact shape does not matter.
  float fast_normal() noexcept {
    const std::uint64_t r = next();
    const std::uint32_t sum = static_cast<std::uint32_t>(r & 0xffff) + ((r >> 16) & 0xffff) +
                              ((r >> 32) & 0xffff) + (r >> 48);
    return (static_cast<float>(sum) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }
  /// Gap to the next chosen element when each element is chosen with probability p (>= 1);
  /// `log1m_p` is log1p(-p), -INFINITY for p = 1. A gap too large for 64 bits (p tiny) comes
  /// back as the largest std::uint64_t.
  std::uint64_t geometric_gap(double log1m_p) noexcept {
    if (log1m_p == -INFINITY) return 1;
    const double u = 1.0 - uniform();
    const double gap = std::log(u) / log1m_p;
    if (!(gap < 0x1.0p63)) return ~std::uint64_t{0};
    return static_cast<std::uint64_t>(gap) + 1;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace dcr::sim
