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
  // not an encoding
  CHECK(code([&] {
          (void)dcr::make_item<std::uint16_t>(0, dcr::dtype::bf16, static_cast<encoding>(9), idx,
                                              w2, w2);
        }) == errc::invalid_argument);
}

// ---- ulp: the distance between order-preserving keys.

namespace {
using dcr::ulp_encoding;

static_assert(ulp_encoding::encode<std::uint16_t>(0x3f80, 0x3f81) == 1);       // 1.0 -> next up
static_assert(ulp_encoding::encode<std::uint16_t>(0x3f81, 0x3f80) == 0xffff);  // and back: -1
static_assert(ulp_encoding::encode<std::uint16_t>(0x8000, 0x0000) == 1);       // -0 -> +0
static_assert(ulp_encoding::encode<std::uint16_t>(0x0001, 0x8001) == 0xfffd);  // +min, +0, -0, -min
static_assert(ulp_encoding::apply<std::uint8_t>(0x80, 1) == 0x00);
static_assert(ulp_encoding::apply<std::uint64_t>(1ull << 63, 1) == 0);
static_assert(dcr::order_unkey<std::uint32_t>(dcr::order_key<std::uint32_t>(0x80000001u)) ==
              0x80000001u);

template <class W>
void check_ulp_pairs(const std::vector<W>& patterns) {
  for (W a : patterns)
    for (W b : patterns) {
      const W d = ulp_encoding::encode<W>(a, b);
      CHECK(ulp_encoding::apply<W>(a, d) == b);
      CHECK((d == 0) == (a == b));
      // keys order like sign-magnitude numbers
      const bool a_neg = (a >> (8 * sizeof(W) - 1)) != 0, b_neg = (b >> (8 * sizeof(W) - 1)) != 0;
      const W mag_mask = static_cast<W>(~W{0} >> 1);
      const W am = a & mag_mask, bm = b & mag_mask;
      const bool less = a_neg != b_neg ? a_neg : (a_neg ? am > bm : am < bm);
      CHECK((dcr::order_key<W>(a) < dcr::order_key<W>(b)) == less);
    }
}
}  // namespace

TEST_CASE("ulp: special float patterns round-trip and keys order as sign-magnitude numbers") {
  check_ulp_pairs<std::uint16_t>({0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001,
                                  0x807f, 0x7f7f, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x03ff, 0x3c00,
                                  0xffff, 0x7fff});
  check_ulp_pairs<std::uint32_t>({0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                  0x7fa00001u, 0xffffffffu, 0x00000001u, 0x807fffffu, 0x3f800000u,
                                  0x7fffffffu});
  check_ulp_pairs<std::uint8_t>({0x00, 0x80, 0x7f, 0xff, 0x7c, 0x7e, 0x01, 0x81, 0x38});
  check_ulp_pairs<std::uint64_t>({0, 1ull << 63, 0x7ff0000000000000ull, 0xfff8000000000001ull,
                                  0x7ff0000000000001ull, 1, ~0ull, ~0ull >> 1});
}

TEST_CASE("ulp: every 8- and 16-bit pair of a sample, and random wide words, round-trip") {
  for (unsigned a = 0; a < 256; ++a)
    for (unsigned b = 0; b < 256; ++b) {
      const auto d = ulp_encoding::encode<std::uint8_t>(static_cast<std::uint8_t>(a),
                                                       static_cast<std::uint8_t>(b));
      REQUIRE(ulp_encoding::apply<std::uint8_t>(static_cast<std::uint8_t>(a), d) == b);
    }
  std::mt19937_64 rng(21);
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t a = rng(), b = rng();
    REQUIRE(ulp_encoding::apply<std::uint16_t>(
                static_cast<std::uint16_t>(a),
                ulp_encoding::encode<std::uint16_t>(static_cast<std::uint16_t>(a),
                                                    static_cast<std::uint16_t>(b))) ==
            static_cast<std::uint16_t>(b));
    REQUIRE(ulp_encoding::apply<std::uint32_t>(
                static_cast<std::uint32_t>(a),
                ulp_encoding::encode<std::uint32_t>(static_cast<std::uint32_t>(a),
                                                    static_cast<std::uint32_t>(b))) ==
            static_cast<std::uint32_t>(b));
    REQUIRE(ulp_encoding::apply<std::uint64_t>(a, ulp_encoding::encode<std::uint64_t>(a, b)) == b);
  }
}

TEST_CASE("ulp: a small float update is a small delta across zero and exponents") {
  // bf16 1.0 (0x3f80) up one ulp, 2.0 (0x4000) down one ulp (0x3fff), +0 to -min subnormal.
  CHECK(ulp_encoding::encode<std::uint16_t>(0x3f80, 0x3f81) == 1);
  CHECK(ulp_encoding::encode<std::uint16_t>(0x4000, 0x3fff) == 0xffff);
  CHECK(ulp_encoding::encode<std::uint16_t>(0x0000, 0x8001) == 0xfffe);  // +0 -> -0 -> -min
  const dcr::item it = dcr::make_item<std::uint16_t>(
      3, dcr::dtype::bf16, dcr::encoding::ulp, std::vector<std::uint64_t>{2, 5},
      std::vector<std::uint16_t>{0x3f80, 0xbf80}, std::vector<std::uint16_t>{0x3f82, 0xbf7f});
  const auto w = it.words<std::uint16_t>();
  CHECK(w[0] == 2);
  CHECK(w[1] == 1);  // -1.0 -> slightly larger (closer to zero): key grows by one
}
