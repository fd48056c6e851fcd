// tensor_view: slices, selects and transposes address the same storage as an engine expects.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/shape.hpp"
#include "dcr/tensor_view.hpp"

TEST_CASE("views slice, select, transpose and copy without owning memory") {
  std::vector<std::uint16_t> data(24);
  std::iota(data.begin(), data.end(), 0);
  auto v = dcr::tensor_view<std::uint16_t>::contiguous(data.data(), {2, 3, 4});
  CHECK(v.size() == 24);
  CHECK(v.is_contiguous());
  CHECK(v.at({1, 2, 3}) == 23);
  auto s = v.slice(2, 1, 2);  // [2,3,2]
  CHECK_FALSE(s.is_contiguous());
  CHECK(s[0] == 1);
  CHECK(s[1] == 2);
  CHECK(s[2] == 5);
  auto sel = v.select(0, 1);  // [3,4]
  CHECK(sel.rank() == 2);
  CHECK(sel[0] == 12);
  auto t = sel.transpose(0, 1);  // [4,3]
  CHECK(t[1] == 16);
  std::vector<std::uint16_t> out(12, 0);
  auto o = dcr::tensor_view<std::uint16_t>::contiguous(out.data(), {4, 3});
  dcr::copy_elements<std::uint16_t>(o, t);
  CHECK(out[0] == 12);
  CHECK(out[1] == 16);
  CHECK(out[3] == 13);
  CHECK_THROWS_AS(v.slice(1, 2, 2), dcr::error);
  CHECK_THROWS_AS(v.select(3, 0), dcr::error);
  CHECK_THROWS_AS(t.reshape({12}), dcr::error);
  dcr::tensor_view<const std::uint16_t> c = v;  // mutable -> const
  CHECK(c.data() == v.data());
}

TEST_CASE("the registry gives ids in name order and a fingerprint that tracks the model") {
  dcr::tensor_registry a({{"b", dcr::dtype::bf16, {2, 2}}, {"a", dcr::dtype::f32, {3}}});
  dcr::tensor_registry b({{"a", dcr::dtype::f32, {3}}, {"b", dcr::dtype::bf16, {2, 2}}});
  CHECK(a.id("a") == 0);
  CHECK(a.id("b") == 1);
  CHECK(a.fingerprint() == b.fingerprint());
  dcr::tensor_registry c({{"a", dcr::dtype::f32, {3}}, {"b", dcr::dtype::bf16, {4}}});
  CHECK(c.fingerprint() != a.fingerprint());
  CHECK(a.total_bytes() == 8 + 12);
  CHECK(a.max_tensor_bytes() == 12);
  CHECK_THROWS_AS((void)a.id("zz"), dcr::error);
  CHECK_THROWS_AS(dcr::tensor_registry({{"a", dcr::dtype::f32, {3}}, {"a", dcr::dtype::f32, {3}}}),
                  dcr::error);
}

namespace {
/// The error a registry of the one tensor `t` is refused with (errc::ok if it is accepted).
dcr::error registry_error(std::vector<dcr::canonical_tensor> tensors) {
  try {
    dcr::tensor_registry r(std::move(tensors));
  } catch (const dcr::error& e) {
    return e;
  }
  return dcr::error(dcr::errc::ok, "accepted");
}
}  // namespace

TEST_CASE("shapes whose element count overflows 64 bits are refused, naming tensor and shape") {
  constexpr std::int64_t two32 = std::int64_t{1} << 32;
  // 2^64 elements: the unchecked product wrapped to numel() == 0.
  const auto e = registry_error({{"ok", dcr::dtype::bf16, {4}},
                                 {"model.huge.weight", dcr::dtype::bf16, {two32, two32}}});
  CHECK(e.dcr_code() == dcr::errc::overflow);
  const std::string what = e.what();
  CAPTURE(what);
  CHECK(what.find("'model.huge.weight'") != std::string::npos);
  CHECK(what.find("[4294967296, 4294967296]") != std::string::npos);
  // A count that fits but whose bytes do not (2^62 f32 elements), a sum of bytes that does not.
  CHECK(registry_error({{"w", dcr::dtype::f32, {std::int64_t{1} << 62}}}).dcr_code() ==
        dcr::errc::overflow);
  CHECK(registry_error({{"a", dcr::dtype::u8, {std::int64_t{1} << 62}},
                        {"b", dcr::dtype::u8, {std::int64_t{1} << 62}}})
            .dcr_code() == dcr::errc::overflow);
  CHECK(registry_error({{"w", dcr::dtype::u8, {3, -1}}}).dcr_code() == dcr::errc::invalid_argument);
  // The largest counts that fit are accepted; a zero extent makes any shape empty.
  CHECK(registry_error({{"a", dcr::dtype::u8, {(std::int64_t{1} << 62) - 1}},
                        {"b", dcr::dtype::u8, {std::int64_t{1} << 62}}})
            .dcr_code() == dcr::errc::ok);
  CHECK(registry_error({{"w", dcr::dtype::u8, {two32, 0, two32}}}).dcr_code() == dcr::errc::ok);

  // The one checked helper behind every shape product.
  const std::vector<std::int64_t> big{two32, two32}, fits{two32, two32 / 2 - 1}, empty{0, two32, two32};
  CHECK_FALSE(dcr::checked_numel(big).has_value());
  CHECK(dcr::checked_numel(fits) == two32 * (two32 / 2 - 1));
  CHECK(dcr::checked_numel(empty) == 0);
  CHECK(dcr::checked_numel(std::vector<std::int64_t>{}) == 1);
  CHECK_FALSE(dcr::checked_numel(std::vector<std::int64_t>{2, -1}).has_value());
  CHECK_FALSE(dcr::checked_numel(fits, two32).has_value());
  // Contiguous views refuse it too; an empty view of huge extents is fine.
  std::uint16_t w = 0;
  try {
    (void)dcr::tensor_view<std::uint16_t>::contiguous(&w, big);
    FAIL("overflowing view accepted");
  } catch (const dcr::error& err) {
    CHECK(err.dcr_code() == dcr::errc::overflow);
  }
  CHECK(dcr::tensor_view<std::uint16_t>::contiguous(&w, empty).size() == 0);
}
