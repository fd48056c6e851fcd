// Element transforms: dtype casts on stored words are exact widenings and round-to-nearest-even
// narrowings with NaN kept a quiet NaN of the same sign, checked exhaustively (16-bit inputs) or
// against independent references (32-bit inputs); sinks apply them and refuse what does not fit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply/sink.hpp"
#include "dcr/apply/transform.hpp"
#include "test_models.hpp"

namespace {

using dcr::cast_kind;
using dcr::dtype;
using dcr::element_transform;
using dcr::encoding;
using dcr::errc;
using dcr::tensor_view;
using dcr_test::code_of;

// Compile-time evaluation (the same functions run in device code).
static_assert(dcr::bf16_bits_to_f32(0x3f80) == 0x3f800000u);
static_assert(dcr::f16_bits_to_f32(0x3c00) == 0x3f800000u);
static_assert(dcr::f16_bits_to_f32(0x0001) == 0x33800000u);  // 2^-24
static_assert(dcr::f32_bits_to_bf16(0x3f808000u) == 0x3f80);  // tie to even (down)
static_assert(dcr::f32_bits_to_bf16(0x3f818000u) == 0x3f82);  // tie to even (up)
static_assert(dcr::f32_bits_to_f16(0x3f800000u) == 0x3c00);
static_assert(element_transform::cast(dtype::bf16, dtype::f32).kind == cast_kind::bf16_to_f32);
static_assert(element_transform::cast(dtype::f32, dtype::f32).preserves_bits());
static_assert(std::is_trivially_copyable_v<element_transform>);

std::vector<std::uint32_t> f32_samples() {
  std::vector<std::uint32_t> out;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1 << 20; ++i) out.push_back(static_cast<std::uint32_t>(rng()));
  // Every exponent with mantissas around the rounding points of both narrow formats.
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t m : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu, 0x8000u,
                              0x8001u, 0x18000u, 0x7fffffu, 0x7fe000u, 0x7ff000u, 0x7fefffu})
        out.push_back(sign | (e << 23) | m);
  return out;
}

double value_of_bf16(std::uint16_t h) { return dcr::bf16_to_float(h); }

/// Round-to-nearest-even to bf16 by comparing distances in double (exact for these operands).
std::uint16_t reference_bf16(std::uint32_t u) {
  const float x = dcr::bit_cast<float>(u);
  const std::uint32_t a = u & 0x7fffffffu;
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const auto down = static_cast<std::uint16_t>(a >> 16);
  const auto up = static_cast<std::uint16_t>(down + 1);
  const double ax = std::fabs(static_cast<double>(x));
  const double lo = value_of_bf16(down);
  const double hi = up == 0x7f80 ? std::ldexp(1.0, 128) : value_of_bf16(up);
  const double dl = ax - lo, dh = hi - ax;
  const bool take_up = dh < dl || (dh == dl && (down & 1u) != 0);
  return static_cast<std::uint16_t>(sign | (take_up ? up : down));
}

}  // namespace

TEST_CASE("widening casts are exact for every bf16 and f16 word") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto w = static_cast<std::uint16_t>(h);
    CHECK(dcr::bf16_bits_to_f32(w) == dcr::bit_cast<std::uint32_t>(dcr::bf16_to_float(w)));
    const std::uint32_t f = dcr::f16_bits_to_f32(w);
    CHECK(f == dcr::bit_cast<std::uint32_t>(dcr::f16_to_float(w)));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (!nan) {
      // Independent: the compiler's _Float16 -> float conversion.
      _Float16 x;
      std::memcpy(&x, &w, 2);
      CHECK(f == dcr::bit_cast<std::uint32_t>(static_cast<float>(x)));
    } else {
      CHECK((f & 0x7fffffffu) > 0x7f800000u);  // still a NaN, payload kept
      CHECK((f >> 31) == (h >> 15));
      CHECK(((f >> 13) & 0x3ffu) == (h & 0x3ffu));
    }
    // Widening then narrowing back is the identity on non-NaN words.
    if (!nan) CHECK(dcr::f32_bits_to_f16(f) == w);
    if (!((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)) CHECK(dcr::f32_bits_to_bf16(dcr::bf16_bits_to_f32(w)) == w);
  }
}

TEST_CASE("narrowing casts round to nearest even; NaN stays a quiet NaN with its sign") {
  for (std::uint32_t u : f32_samples()) {
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const std::uint16_t b = dcr::f32_bits_to_bf16(u);
    const std::uint16_t h = dcr::f32_bits_to_f16(u);
    CHECK(b == dcr::float_to_bf16(dcr::bit_cast<float>(u)));
    CHECK(h == dcr::float_to_f16(dcr::bit_cast<float>(u)));
    if (nan) {
      CHECK((b & 0x7fc0u) == 0x7fc0u);  // quiet NaN
      CHECK((b >> 15) == (u >> 31));
      CHECK((h & 0x7e00u) == 0x7e00u);
      CHECK((h >> 15) == (u >> 31));
      continue;
    }
    CHECK(b == reference_bf16(u));
    const _Float16 x = static_cast<_Float16>(dcr::bit_cast<float>(u));
    std::uint16_t hx;
    std::memcpy(&hx, &x, 2);
    CHECK(h == hx);
  }
  // Infinities and signalling NaNs.
  CHECK(dcr::f32_bits_to_bf16(0x7f800000u) == 0x7f80);
  CHECK(dcr::f32_bits_to_bf16(0xff800000u) == 0xff80);
  CHECK(dcr::f32_bits_to_bf16(0x7f800001u) == 0x7fc0);
  CHECK(dcr::f32_bits_to_bf16(0xff800001u) == 0xffc0);
  CHECK(dcr::f32_bits_to_f16(0x7f800001u) == 0x7e00);
  CHECK(dcr::f32_bits_to_f16(0xff800001u) == 0xfe00);
  CHECK(dcr::f32_bits_to_bf16(0x7f7fffffu) == 0x7f80);  // rounds past the largest bf16
  CHECK(dcr::f32_bits_to_f16(0x477ff000u) == 0x7c00);   // halfway past 65504: ties to inf
  CHECK(dcr::f32_bits_to_f16(0x477fefffu) == 0x7bff);
}

TEST_CASE("bf16 <-> f16 casts round once through the exact f32") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto w = static_cast<std::uint16_t>(h);
    CHECK(dcr::transform_word<std::uint16_t>(element_transform::cast(dtype::bf16, dtype::f16), w) ==
          dcr::f32_bits_to_f16(dcr::bf16_bits_to_f32(w)));
    CHECK(dcr::transform_word<std::uint16_t>(element_transform::cast(dtype::f16, dtype::bf16), w) ==
          dcr::f32_bits_to_bf16(dcr::f16_bits_to_f32(w)));
  }
}

TEST_CASE("element_transform values") {
  CHECK(element_transform{} == element_transform::identity());
  CHECK(element_transform::cast(dtype::f16, dtype::f16) == element_transform::identity());
  CHECK(element_transform::cast(dtype::f32, dtype::bf16).from() == dtype::f32);
  CHECK(element_transform::cast(dtype::f32, dtype::bf16).to() == dtype::bf16);
  CHECK_FALSE(element_transform::cast(dtype::f32, dtype::f16).preserves_bits());
  CHECK(dcr::transform_name(element_transform::cast(dtype::bf16, dtype::f32)) == "cast BF16->F32");
  CHECK(dcr::transform_name(element_transform::identity()) == "identity");
  CHECK(code_of([] { (void)element_transform::cast(dtype::f32, dtype::i32); }) == errc::invalid_argument);
  CHECK(code_of([] { (void)element_transform::cast(dtype::f64, dtype::f32); }) == errc::invalid_argument);
  CHECK(dcr::transform_word<std::uint32_t>(element_transform::identity(), std::uint32_t{0xdeadbeef}) ==
        0xdeadbeefu);
}

TEST_CASE("sinks apply a transform to every element (dense) or to the records (delta)") {
  const dcr::canonical_tensor t{"norm", dtype::bf16, {2, 3}};
  std::vector<std::uint16_t> src{0x3f80, 0xbf80, 0x7fc1, 0x0001, 0x8000, 0x7f80};
  std::vector<std::uint32_t> out(6, 0xa5a5a5a5u);
  const auto tr = element_transform::cast(dtype::bf16, dtype::f32);
  auto s = tensor_view<const std::uint16_t>::contiguous(src.data(), {2, 3});
  auto d = tensor_view<std::uint32_t>::contiguous(out.data(), {3, 2}).transpose(0, 1);
  dcr::dense_sink<std::uint16_t> dense;
  dense.begin(t);
  dense.copy(d, s, tr);
  CHECK(dense.finish().elements == 6);
  CHECK(out == std::vector<std::uint32_t>{0x3f800000u, 0x00010000u, 0xbf800000u, 0x80000000u,
                                          0x7fc10000u, 0x7f800000u});
  // Wrong widths or dtype.
  dense.begin(t);
  CHECK(code_of([&] { dense.copy(d, s, element_transform::cast(dtype::f16, dtype::f32)); }) ==
        errc::dtype_mismatch);
  std::vector<std::uint16_t> out16(6);
  auto d16 = tensor_view<std::uint16_t>::contiguous(out16.data(), {2, 3});
  CHECK(code_of([&] { dense.copy(d16, s, tr); }) == errc::dtype_mismatch);

  // Delta: overwrite records store cast(value); xor/ulp records are refused on a cast copy.
  std::vector<std::uint16_t> scratch(6, 0);
  auto whole = tensor_view<const std::uint16_t>::contiguous(scratch.data(), {2, 3});
  const std::vector<std::uint64_t> active{1, 4};
  const std::vector<std::uint16_t> values{0x4000, 0xffc0};
  std::vector<dcr::write_record> log;
  dcr::delta_sink<std::uint16_t> delta;
  for (auto pass : {dcr::delta_pass::check, dcr::delta_pass::write}) {
    delta.begin(t, scratch.data(), active, values, encoding::overwrite, pass, &log);
    delta.copy(d, whole, tr);
    CHECK(delta.finish().elements == 2);
  }
  CHECK(out[2] == 0x40000000u);  // element (0, 1) sits at out[1 * 2 + 0]
  CHECK(out[3] == 0xffc00000u);  // element (1, 1) sits at out[1 * 2 + 1]
  REQUIRE(log.size() == 2);
  CHECK(log[0].index == 1);
  CHECK(log[0].transform == tr);
  CHECK(log[0].before == 0xbf800000u);
  for (encoding enc : dcr_test::supported_encodings()) {
    if (enc == encoding::overwrite) continue;
    delta.begin(t, scratch.data(), active, values, enc, dcr::delta_pass::check);
    CHECK(code_of([&] { delta.copy(d, whole, tr); }) == errc::unsupported_loader_path);
  }
}
