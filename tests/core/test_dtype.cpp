// Narrow-float conversions used for synthetic data: exact round trips, round to nearest even.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "dcr/dtype.hpp"

TEST_CASE("bf16 and f16 words survive a round trip through float") {
  for (std::uint32_t w = 0; w < 0x10000; ++w) {
    const auto h = static_cast<std::uint16_t>(w);
    const float b = dcr::bf16_to_float(h);
    const float f = dcr::f16_to_float(h);
    if (std::isnan(b)) {
      CHECK(std::isnan(dcr::bf16_to_float(dcr::float_to_bf16(b))));
    } else {
      REQUIRE(dcr::float_to_bf16(b) == h);
    }
    if (std::isnan(f)) {
      CHECK(std::isnan(dcr::f16_to_float(dcr::float_to_f16(f))));
    } else {
      REQUIRE(dcr::float_to_f16(f) == h);
    }
  }
}

TEST_CASE("float to bf16/f16 rounds to nearest, ties to even") {
  CHECK(dcr::float_to_bf16(1.0f) == 0x3f80);
  CHECK(dcr::float_to_bf16(dcr::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(dcr::float_to_bf16(dcr::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(dcr::float_to_bf16(dcr::bit_cast<float>(0x3f808001u)) == 0x3f81);
  CHECK(dcr::float_to_f16(1.0f) == 0x3c00);
  CHECK(dcr::float_to_f16(65520.0f) == 0x7c00);         // rounds to infinity
  CHECK(dcr::float_to_f16(5.960464477539063e-08f) == 0x0001);  // smallest subnormal
  CHECK(dcr::float_to_f16(2.98023223876953125e-08f) == 0x0000);  // tie to even (zero)
  CHECK(dcr::float_to_f16(-0.0f) == 0x8000);
}

TEST_CASE("dtype names and codes round trip") {
  for (auto t : {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32, dcr::dtype::f64,
                 dcr::dtype::f8_e4m3, dcr::dtype::f8_e5m2, dcr::dtype::i8, dcr::dtype::u8,
                 dcr::dtype::i16, dcr::dtype::u16, dcr::dtype::i32, dcr::dtype::u32,
                 dcr::dtype::i64, dcr::dtype::u64, dcr::dtype::boolean}) {
    CHECK(dcr::parse_dtype(dcr::dtype_name(t)) == t);
    CHECK(dcr::dtype_from_code(static_cast<std::uint8_t>(t)) == t);
    CHECK(dcr::dtype_size(t) > 0);
  }
  CHECK_FALSE(dcr::parse_dtype("F4").has_value());
  CHECK_FALSE(dcr::dtype_from_code(0).has_value());
  CHECK_FALSE(dcr::dtype_from_code(200).has_value());
}
