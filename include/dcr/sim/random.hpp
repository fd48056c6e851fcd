// dcr/sim/random.hpp: small, fast, seedable generators for synthetic weights and updates.
// Deterministic across platforms for a given seed (no std::*_distribution, whose output the
// standard leaves to the implementation).
#pragma once

#include <cmath>
#include <cstdint>

namespace dcr::sim {

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
  /// Gap to the next chosen element when each element is chosen with probability p (>= 1).
  std::uint64_t geometric_gap(double log1m_p) noexcept {
    if (log1m_p == -INFINITY) return 1;
    const double u = 1.0 - uniform();
    return static_cast<std::uint64_t>(std::log(u) / log1m_p) + 1;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace dcr::sim
