// Per-element encodings: xor masks and overwrites turn old bits into new bits exactly, whatever
// the bits mean as floats.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "dcr/codec/values.hpp"

namespace {

using dcr::overwrite_encoding;
using dcr::xor_encoding;

// Compile-time: the functors are constexpr, so device and host share one definition.
static_assert(xor_encoding::apply<std::uint16_t>(0x3f80, xor_encoding::encode<std::uint16_t>(0x3f80, 0xbf80)) ==
              0xbf80);
static_assert(overwrite_encoding::apply<std::uint8_t>(0x12, 0x34) == 0x34);
static_assert(xor_encoding::encode<std::uint64_t>(~0ull, 0) == ~0ull);

template <class W>
void check_pairs(const std::vector<W>& patterns) {
  for (W old_bits : patterns) {
    for (W new_bits : patterns) {
      const W mask = xor_encoding::encode<W>(old_bits, new_bits);
      CHECK(xor_encoding::apply<W>(old_bits, mask) == new_bits);
      CHECK(xor_encoding::apply<W>(xor_encoding::apply<W>(old_bits, mask), mask) == old_bits);  // twice restores
      CHECK((mask == 0) == (old_bits == new_bits));  // bitwise, so -0 != +0 and NaN == same NaN
      CHECK(overwrite_encoding::apply<W>(old_bits, new_bits) == new_bits);
      CHECK(overwrite_encoding::apply<W>(overwrite_encoding::apply<W>(old_bits, new_bits), new_bits) == new_bits);
    }
  }
}

template <class W>
void check_random(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    const W a = static_cast<W>(rng());
    const W b = static_cast<W>(rng());
    const W mask = xor_encoding::encode<W>(a, b);
    REQUIRE(xor_encoding::apply<W>(a, mask) == b);
    REQUIRE(xor_encoding::apply<W>(b, mask) == a);
    REQUIRE(overwrite_encoding::apply<W>(a, b) == b);
  }
}

}  // namespace

TEST_CASE("xor/overwrite: special float patterns round-trip bit for bit") {
  // bf16 / f16: +0, -0, +inf, -inf, quiet and signalling NaNs with payloads, subnormals, max.
  check_pairs<std::uint16_t>({0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001,
                              0x807f, 0x7f7f, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x03ff, 0x3c00});
  // f32
  check_pairs<std::uint32_t>({0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0x7fa00001u, 0xffffffffu, 0x00000001u, 0x807fffffu, 0x3f800000u});
  // f8 e4m3 / e5m2 and bytes
  check_pairs<std::uint8_t>({0x00, 0x80, 0x7f, 0xff, 0x7c, 0x7e, 0x01, 0x81, 0x38});
  // f64 / u64
  check_pairs<std::uint64_t>({0, 1ull << 63, 0x7ff0000000000000ull, 0xfff8000000000001ull,
                              0x7ff0000000000001ull, 1, ~0ull});
}

TEST_CASE("xor/overwrite: random words of every width") {
  check_random<std::uint8_t>(1);
  check_random<std::uint16_t>(2);
  check_random<std::uint32_t>(3);
  check_random<std::uint64_t>(4);
}

TEST_CASE("make_item: applying the item to the old words gives the new words") {
  std::mt19937_64 rng(11);
  const std::vector<std::uint64_t> idx = {0, 3, 4, 90, 99};
  std::vector<std::uint16_t> old_bits(idx.size()), new_bits(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    old_bits[i] = static_cast<std::uint16_t>(rng());
    new_bits[i] = static_cast<std::uint16_t>(rng());
  }
  new_bits[1] = 0x8000;  // -0 over whatever was there
  old_bits[2] = 0x0000;
  new_bits[2] = 0x8000;  // +0 -> -0 is a change
  for (auto enc : {dcr::encoding::xor_mask, dcr::encoding::overwrite}) {
    CAPTURE(static_cast<int>(enc));
    const dcr::item it =
        dcr::make_item<std::uint16_t>(7, dcr::dtype::bf16, enc, idx, old_bits, new_bits);
    CHECK(it.tensor == 7);
    CHECK(it.type == dcr::dtype::bf16);
    CHECK(it.enc == enc);
    CHECK(it.indices == idx);
    REQUIRE(it.values.size() == idx.size() * 2);
    const auto w = it.words<std::uint16_t>();
    for (std::size_t i = 0; i < idx.size(); ++i) {
      const std::uint16_t got = enc == dcr::encoding::xor_mask
                                    ? xor_encoding::apply<std::uint16_t>(old_bits[i], w[i])
                                    : overwrite_encoding::apply<std::uint16_t>(old_bits[i], w[i]);
      CHECK(got == new_bits[i]);
    }
  }
  const dcr::item empty =
      dcr::make_item<std::uint32_t>(0, dcr::dtype::f32, dcr::encoding::xor_mask, {}, {}, {});
  CHECK(empty.count() == 0);
  CHECK(empty.values.empty());
}

TEST_CASE("make_item: contract violations throw invalid_argument") {
  const std::vector<std::uint64_t> idx = {1, 2};
  const std::vector<std::uint16_t> w2 = {1, 2};
  const std::vector<std::uint16_t> w1 = {1};
  const auto code = [](auto&& f) {
    try {
      f();
    } catch (const dcr::error& e) {
      return e.dcr_code();
    }
    return dcr::errc::ok;
  };
  using dcr::encoding;
  using dcr::errc;
  // word width differs from the dtype
  CHECK(code([&] {
          (void)dcr::make_item<std::uint16_t>(0, dcr::dtype::f32, encoding::xor_mask, idx, w2, w2);
        }) == errc::invalid_argument);
  // lengths differ
  CHECK(code([&] {
          (void)dcr::make_item<std::uint16_t>(0, dcr::dtype::bf16, encoding::xor_mask, idx, w1, w2);
        }) == errc::invalid_argument);
  // not strictly increasing
  const std::vector<std::uint64_t> dup = {2, 2};
  CHECK(code([&] {
          (void)dcr::make_item<std::uint16_t>(0, dcr::dtype::bf16, encoding::overwrite, dup, w2,
                                              w2);
        }) == errc::invalid_argument);
  // ulp is not in format version 1
  CHECK(code([&] {
          (void)dcr::make_item<std::uint16_t>(0, dcr::dtype::bf16, encoding::ulp, idx, w2, w2);
        }) == errc::invalid_argument);
}
