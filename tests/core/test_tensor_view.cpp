// tensor_view: slices, selects and transposes address the same storage as an engine expects.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "dcr/canonical.hpp"
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
