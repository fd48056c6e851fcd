// Change detection compares stored bits: -0/+0 and NaN payloads count, float equality does not.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "dcr/detect/detect.hpp"
#include "dcr/sim/random.hpp"

namespace {

template <class W>
std::vector<std::uint64_t> reference(const std::vector<W>& a, const std::vector<W>& b, std::uint64_t base) {
  std::vector<std::uint64_t> out;
  for (std::size_t j = 0; j < a.size(); ++j)
    if (a[j] != b[j]) out.push_back(base + j);
  return out;
}

template <class W>
void random_case(dcr::sim::rng& g, std::size_t n, double rate) {
  std::vector<W> a(n), b(n);
  for (auto& x : a) x = static_cast<W>(g.next());
  b = a;
  for (auto& x : b)
    if (g.uniform() < rate) x = static_cast<W>(x ^ static_cast<W>(1 + g.next() % 0xff));
  std::vector<std::uint64_t> got{99};  // detect appends: existing content stays
  const auto count = dcr::detect_changes<W>(a, b, got, 1000);
  auto expect = reference(a, b, 1000);
  REQUIRE(got.size() == expect.size() + 1);
  CHECK(got[0] == 99);
  CHECK(count == expect.size());
  CHECK(std::equal(expect.begin(), expect.end(), got.begin() + 1));
}

}  // namespace

TEST_CASE("detect_changes matches a word-by-word reference for every word size and tail") {
  dcr::sim::rng g(3);
  for (std::size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 1000u, 4099u})
    for (double rate : {0.0, 0.01, 0.3, 1.0}) {
      random_case<std::uint8_t>(g, n, rate);
      random_case<std::uint16_t>(g, n, rate);
      random_case<std::uint32_t>(g, n, rate);
      random_case<std::uint64_t>(g, n, rate);
    }
}

TEST_CASE("every instruction-set variant of the detection loop agrees with the reference") {
  dcr::sim::rng g(9);
  auto run = [&](auto w, auto loop) {
    using W = decltype(w);
    constexpr std::size_t n = dcr::detail::detect_chunk_words;
    std::vector<W> a(n), b(n);
    for (auto& x : a) x = static_cast<W>(g.next());
    for (double rate : {0.0, 0.01, 0.5, 1.0}) {
      b = a;
      for (auto& x : b)
        if (g.uniform() < rate) x = static_cast<W>(x ^ (W{1} << (g.next() % (8 * sizeof(W)))));
      std::vector<std::uint16_t> offsets(n + dcr::detail::detect_out_slack);
      const std::size_t k = loop(a.data(), b.data(), n, offsets.data());
      const auto expect = reference(a, b, 0);
      REQUIRE(k == expect.size());
      for (std::size_t q = 0; q < k; ++q) REQUIRE(offsets[q] == expect[q]);
    }
  };
  auto all = [&](auto w) {
    using W = decltype(w);
    run(W{}, &dcr::detail::detect_loop_portable<W>);
#if DCR_DETECT_X86
    if (__builtin_cpu_supports("avx2")) run(W{}, &dcr::detail::detect_loop_avx2<W>);
    if (dcr::detail::detect_has_avx512())
      run(W{}, &dcr::detail::detect_loop_avx512<W>);
#endif
  };
  all(std::uint8_t{});
  all(std::uint16_t{});
  all(std::uint32_t{});
  all(std::uint64_t{});
}

TEST_CASE("detection sees bit changes that float equality would hide or invent") {
  // bf16 words: +0 vs -0 (equal as floats), same NaN (unequal as floats), NaN payload change.
  const std::vector<std::uint16_t> old_bits{0x0000, 0x7fc1, 0x7fc1, 0x3f80, 0x0001, 0x7f80};
  const std::vector<std::uint16_t> new_bits{0x8000, 0x7fc1, 0x7fc2, 0x3f80, 0x0002, 0xff80};
  std::vector<std::uint64_t> changed;
  dcr::detect_changes<std::uint16_t>(old_bits, new_bits, changed);
  CHECK(changed == std::vector<std::uint64_t>{0, 2, 4, 5});
}

TEST_CASE("detect_changes refuses spans of different length") {
  std::vector<std::uint16_t> a(4), b(5);
  std::vector<std::uint64_t> out;
  CHECK_THROWS_AS(dcr::detect_changes<std::uint16_t>(a, b, out), dcr::error);
}
