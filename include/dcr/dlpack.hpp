// dcr/dlpack.hpp: zero-copy views of DLPack tensors (PyTorch, JAX, CuPy... through their
// DLPack export), so framework tensors plug into dcr without copies.
//
// Needs <dlpack/dlpack.h> (Debian: libdlpack-dev); not included by dcr.hpp. The view aliases
// the DLTensor's memory: keep the producer's tensor (or its DLManagedTensor) alive while the
// view is in use.
#pragma once

#include <dlpack/dlpack.h>

#include <optional>
#include <string>

#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/shape.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// Where a view may live: host memory (CPU, CUDA pinned host, CUDA managed) or CUDA device
/// memory (for the kernels in kernels/dcr/kernels).
enum class memory_space { host, cuda_device };

/// The dcr dtype of a DLPack data type; nullopt for vector lanes and types dcr does not move.
inline std::optional<dtype> dtype_of(DLDataType t) noexcept {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLBfloat: return t.bits == 16 ? std::optional(dtype::bf16) : std::nullopt;
    case kDLFloat:
      if (t.bits == 16) return dtype::f16;
      if (t.bits == 32) return dtype::f32;
      if (t.bits == 64) return dtype::f64;
      return std::nullopt;
    case kDLInt:
      if (t.bits == 8) return dtype::i8;
      if (t.bits == 16) return dtype::i16;
      if (t.bits == 32) return dtype::i32;
      if (t.bits == 64) return dtype::i64;
      return std::nullopt;
    case kDLUInt:
      if (t.bits == 8) return dtype::u8;
      if (t.bits == 16) return dtype::u16;
      if (t.bits == 32) return dtype::u32;
      if (t.bits == 64) return dtype::u64;
      return std::nullopt;
    default: return std::nullopt;
  }
}

/// Views `t` as words W without copying. Checks: one lane, element width equal to sizeof(W),
/// rank <= dcr::max_rank, non-negative extents, and a device in `space` (host: kDLCPU,
/// kDLCUDAHost, kDLCUDAManaged; cuda_device: kDLCUDA, kDLCUDAManaged). Null strides mean
/// compact row-major, as DLPack specifies; byte_offset is applied. Throws dcr::error
/// (dtype_mismatch, invalid_argument) naming what differs.
template <storage_word W>
tensor_view<W> from_dlpack(const DLTensor& t, memory_space space = memory_space::host) {
  DCR_EXPECTS(t.dtype.lanes == 1, errc::dtype_mismatch,
              "from_dlpack: vector types (lanes = " + std::to_string(t.dtype.lanes) +
                  ") are not supported");
  DCR_EXPECTS(t.dtype.bits == 8 * sizeof(W), errc::dtype_mismatch,
              "from_dlpack: " + std::to_string(t.dtype.bits) + "-bit elements viewed as " +
                  std::to_string(8 * sizeof(W)) + "-bit words");
  const auto dev = t.device.device_type;
  const bool ok = space == memory_space::host
                      ? (dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged)
                      : (dev == kDLCUDA || dev == kDLCUDAManaged);
  DCR_EXPECTS(ok, errc::invalid_argument,
              "from_dlpack: tensor on device type " + std::to_string(static_cast<int>(dev)) +
                  " is not in the requested memory space");
  DCR_EXPECTS(t.ndim >= 0 && t.ndim <= max_rank, errc::invalid_argument,
              "from_dlpack: rank " + std::to_string(t.ndim) + " exceeds dcr::max_rank");
  DCR_EXPECTS(t.ndim == 0 || t.shape != nullptr, errc::invalid_argument,
              "from_dlpack: missing shape");
  (void)expect_numel(std::span<const std::int64_t>(t.shape, static_cast<std::size_t>(t.ndim)), 1,
                     "from_dlpack");
  index_array extents{}, strides{};
  std::uint64_t stride = 1;  // unsigned: an empty tensor's strides may wrap, addressing nothing
  for (int d = t.ndim - 1; d >= 0; --d) {
    extents[d] = t.shape[d];
    strides[d] = t.strides != nullptr ? t.strides[d] : static_cast<std::int64_t>(stride);
    stride *= static_cast<std::uint64_t>(t.shape[d]);
  }
  auto* base = static_cast<std::byte*>(t.data) + t.byte_offset;
  return tensor_view<W>(reinterpret_cast<W*>(base), t.ndim, extents, strides);
}

}  // namespace dcr
