// The vectorized writer of skip_buckets location streams (AVX-512) writes exactly the bytes of
// the scalar bucket writer for every mantissa width, skip size and tail length.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "dcr/codec/streams.hpp"
#include "dcr/sim/random.hpp"

namespace {

// Strictly increasing indices whose skips mix small gaps, runs (skip 0) and large jumps.
std::vector<std::uint64_t> random_indices(dcr::sim::rng& g, std::size_t n, unsigned max_bits) {
  std::vector<std::uint64_t> idx(n);
  std::uint64_t next = 0;
  for (auto& x : idx) {
    const unsigned kind = static_cast<unsigned>(g.next() % 8);
    const std::uint64_t skip = kind == 0   ? 0
                               : kind == 1 ? g.next() >> (64 - max_bits)
                                           : g.next() % 40;
    x = next + skip;
    next = x + 1;
  }
  return idx;
}

}  // namespace

TEST_CASE("skip_buckets: the AVX-512 symbol writer matches the scalar one byte for byte") {
#if DCR_STREAMS_X86
  if (!dcr::detail::streams_have_avx512()) return;
  dcr::sim::rng g(21);
  for (unsigned m = 0; m <= 7; ++m)
    for (std::size_t n : {0u, 1u, 2u, 8u, 9u, 16u, 17u, 1000u, 4103u}) {
      // Skips wide enough to overflow the 56 bits of one put, within what M can carry.
      const unsigned max_bits = std::min(dcr::detail::bucket_max_width(m), 40u);
      const auto idx = random_indices(g, n, max_bits);
      CAPTURE(m);
      CAPTURE(n);
      const std::size_t room = 8 * n + 16;
      std::vector<std::byte> sym_a(n + 8), sym_b(n + 8), extra_a(room), extra_b(room);
      std::size_t extra_vector = 0, extra_scalar = 0;
      dcr::detail::visit_mantissa(m, [&](auto mc) {
        constexpr unsigned M = decltype(mc)::value;
        extra_vector = dcr::detail::write_skip_symbols_avx512<M>(idx.data(), sym_a.data(),
                                                                 extra_a.data(), n);
        auto gen = [at = idx.data(), next = std::uint64_t{0}](std::size_t j) mutable {
          const std::uint64_t skip = at[j] - next;
          next = at[j] + 1;
          return skip;
        };
        extra_scalar =
            dcr::detail::write_bucket_symbols<M>(sym_b.data(), extra_b.data(), n, gen);
      });
      REQUIRE(extra_vector == extra_scalar);
      CHECK(std::equal(sym_a.begin(), sym_a.begin() + static_cast<std::ptrdiff_t>(n),
                       sym_b.begin()));
      CHECK(std::equal(extra_a.begin(),
                       extra_a.begin() + static_cast<std::ptrdiff_t>(extra_vector),
                       extra_b.begin()));
    }
#endif
}
