// DLPack tensors plug in without copies: same memory, strides and byte offsets honoured.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "dcr/dcr.hpp"  // the umbrella must compile on its own
#include "dcr/dlpack.hpp"

TEST_CASE("from_dlpack views framework tensors in place") {
  std::vector<std::uint16_t> data(2 + 12);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint16_t>(i);
  std::int64_t shape[2] = {3, 4};
  DLTensor t{};
  t.data = data.data();
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 2 * sizeof(std::uint16_t);
  CHECK(dcr::dtype_of(t.dtype) == dcr::dtype::bf16);
  auto v = dcr::from_dlpack<std::uint16_t>(t);
  CHECK(v.is_contiguous());
  CHECK(v.size() == 12);
  CHECK(v.at({1, 2}) == 2 + 6);
  v.at({0, 0}) = 999;  // writes through to the producer's memory
  CHECK(data[2] == 999);

  // A transposed export: strides in elements.
  std::int64_t tshape[2] = {4, 3};
  std::int64_t tstrides[2] = {1, 4};
  t.shape = tshape;
  t.strides = tstrides;
  auto tv = dcr::from_dlpack<std::uint16_t>(t);
  CHECK(tv.at({2, 1}) == data[2 + 1 * 4 + 2]);
}

TEST_CASE("from_dlpack refuses mismatched widths, lanes and devices") {
  float f[4] = {};
  std::int64_t shape[1] = {4};
  DLTensor t{};
  t.data = f;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  CHECK(dcr::dtype_of(t.dtype) == dcr::dtype::f32);
  CHECK_NOTHROW(dcr::from_dlpack<std::uint32_t>(t));
  CHECK_THROWS_AS(dcr::from_dlpack<std::uint16_t>(t), dcr::error);
  t.dtype.lanes = 4;
  CHECK_THROWS_AS(dcr::from_dlpack<std::uint32_t>(t), dcr::error);
  CHECK_FALSE(dcr::dtype_of(t.dtype).has_value());
  t.dtype.lanes = 1;
  t.device = {kDLCUDA, 0};
  CHECK_THROWS_AS(dcr::from_dlpack<std::uint32_t>(t), dcr::error);
  CHECK_NOTHROW(dcr::from_dlpack<std::uint32_t>(t, dcr::memory_space::cuda_device));
  // A shape whose element count overflows 64 bits.
  t.device = {kDLCPU, 0};
  std::int64_t huge[2] = {std::int64_t{1} << 32, std::int64_t{1} << 32};
  t.ndim = 2;
  t.shape = huge;
  try {
    (void)dcr::from_dlpack<std::uint32_t>(t);
    FAIL("overflowing shape accepted");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::overflow);
  }
}
