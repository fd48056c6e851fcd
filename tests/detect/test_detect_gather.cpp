// detect_and_gather: the changed indices of detect_changes plus the old and new word of each, in
// one pass; every instruction-set variant of its loop agrees with a word-by-word reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dcr/detect/detect.hpp"
#include "dcr/sim/random.hpp"

namespace {

template <class W>
struct records {
  std::vector<std::uint64_t> indices;
  std::vector<W> old_words, new_words;
};

template <class W>
records<W> reference(const std::vector<W>& a, const std::vector<W>& b, std::uint64_t base) {
  records<W> r;
  for (std::size_t j = 0; j < a.size(); ++j)
    if (a[j] != b[j]) {
      r.indices.push_back(base + j);
      r.old_words.push_back(a[j]);
      r.new_words.push_back(b[j]);
    }
  return r;
}

template <class W>
std::vector<W> words_of(const std::vector<std::byte>& bytes) {
  std::vector<W> w(bytes.size() / sizeof(W));
  if (!w.empty()) std::memcpy(w.data(), bytes.data(), w.size() * sizeof(W));
  return w;
}

template <class W>
void random_case(dcr::sim::rng& g, std::size_t n, double rate) {
  std::vector<W> a(n), b(n);
  for (auto& x : a) x = static_cast<W>(g.next());
  b = a;
  for (auto& x : b)
    if (g.uniform() < rate) x = static_cast<W>(x ^ static_cast<W>(1 + g.next() % 0xff));
  const auto expect = reference(a, b, 500);

  // Typed outputs, appended after existing content.
  std::vector<std::uint64_t> indices{7};
  std::vector<W> old_words{W{1}}, new_words{W{2}};
  const auto count = dcr::detect_and_gather<W>(a, b, indices, old_words, new_words, 500);
  CHECK(count == expect.indices.size());
  REQUIRE(indices.size() == expect.indices.size() + 1);
  REQUIRE(old_words.size() == expect.indices.size() + 1);
  REQUIRE(new_words.size() == expect.indices.size() + 1);
  CHECK((indices[0] == 7 && old_words[0] == W{1} && new_words[0] == W{2}));
  CHECK(std::equal(expect.indices.begin(), expect.indices.end(), indices.begin() + 1));
  CHECK(std::equal(expect.old_words.begin(), expect.old_words.end(), old_words.begin() + 1));
  CHECK(std::equal(expect.new_words.begin(), expect.new_words.end(), new_words.begin() + 1));

  // Byte outputs (the layout of item::values) and the indices detect_changes finds.
  std::vector<std::uint64_t> indices2, plain;
  std::vector<std::byte> old_bytes, new_bytes;
  CHECK(dcr::detect_and_gather<W>(a, b, indices2, old_bytes, new_bytes, 500) == count);
  dcr::detect_changes<W>(a, b, plain, 500);
  CHECK(indices2 == plain);
  CHECK(words_of<W>(old_bytes) == expect.old_words);
  CHECK(words_of<W>(new_bytes) == expect.new_words);
}

}  // namespace

TEST_CASE("detect_and_gather matches a word-by-word reference for every word size and tail") {
  dcr::sim::rng g(5);
  for (std::size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 1000u, 4099u, 20000u})
    for (double rate : {0.0, 0.01, 0.3, 1.0}) {
      random_case<std::uint8_t>(g, n, rate);
      random_case<std::uint16_t>(g, n, rate);
      random_case<std::uint32_t>(g, n, rate);
      random_case<std::uint64_t>(g, n, rate);
    }
}

TEST_CASE("every instruction-set variant of the gathering loop agrees with the reference") {
  dcr::sim::rng g(11);
  auto run = [&](auto w, auto loop, const char* name) {
    using W = decltype(w);
    CAPTURE(name);
    CAPTURE(sizeof(W));
    constexpr std::size_t n = dcr::detail::detect_chunk_words;
    std::vector<W> a(n), b(n);
    for (auto& x : a) x = static_cast<W>(g.next());
    for (double rate : {0.0, 0.01, 0.5, 1.0}) {
      for (std::size_t j = 0; j < n; ++j)
        b[j] = g.uniform() < rate ? static_cast<W>(a[j] ^ (W{1} << (g.next() % (8 * sizeof(W)))))
                                  : a[j];
      std::vector<std::uint16_t> offsets(n + dcr::detail::detect_out_slack);
      std::vector<W> olds(n + dcr::detail::gather_out_slack), news(n + dcr::detail::gather_out_slack);
      const std::size_t k = loop(a.data(), b.data(), n, offsets.data(), olds.data(), news.data());
      const auto expect = reference(a, b, 0);
      REQUIRE(k == expect.indices.size());
      for (std::size_t q = 0; q < k; ++q) {
        REQUIRE(offsets[q] == expect.indices[q]);
        REQUIRE(olds[q] == expect.old_words[q]);
        REQUIRE(news[q] == expect.new_words[q]);
      }
    }
  };
  auto all = [&](auto w) {
    using W = decltype(w);
    run(W{}, &dcr::detail::detect_gather_loop_portable<W>, "portable");
#if DCR_DETECT_X86
    if (__builtin_cpu_supports("avx2")) run(W{}, &dcr::detail::detect_gather_loop_avx2<W>, "avx2");
    if (dcr::detail::detect_has_avx512())
      run(W{}, &dcr::detail::detect_gather_loop_avx512<W>, "avx512");
#endif
  };
  all(std::uint8_t{});
  all(std::uint16_t{});
  all(std::uint32_t{});
  all(std::uint64_t{});
}

TEST_CASE("detect_and_gather compares stored bits and keeps the words bit for bit") {
  // bf16 words: +0 vs -0, an unchanged NaN, a NaN payload change, a subnormal, an infinity flip.
  const std::vector<std::uint16_t> old_bits{0x0000, 0x7fc1, 0x7fc1, 0x3f80, 0x0001, 0x7f80};
  const std::vector<std::uint16_t> new_bits{0x8000, 0x7fc1, 0x7fc2, 0x3f80, 0x0002, 0xff80};
  std::vector<std::uint64_t> changed;
  std::vector<std::uint16_t> olds, news;
  dcr::detect_and_gather<std::uint16_t>(old_bits, new_bits, changed, olds, news);
  CHECK(changed == std::vector<std::uint64_t>{0, 2, 4, 5});
  CHECK(olds == std::vector<std::uint16_t>{0x0000, 0x7fc1, 0x0001, 0x7f80});
  CHECK(news == std::vector<std::uint16_t>{0x8000, 0x7fc2, 0x0002, 0xff80});
}

TEST_CASE("detect_and_gather refuses spans of different length and leaves the outputs alone") {
  std::vector<std::uint32_t> a(4), b(5);
  std::vector<std::uint64_t> out{1};
  std::vector<std::uint32_t> olds{2}, news{3};
  CHECK_THROWS_AS(dcr::detect_and_gather<std::uint32_t>(a, b, out, olds, news), dcr::error);
  CHECK((out.size() == 1 && olds.size() == 1 && news.size() == 1));
}
