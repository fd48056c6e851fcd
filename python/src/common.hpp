// python/src/common.hpp: what every part of the binding shares: tensors through DLPack as byte
// spans (checked, named), dtype names, the exception translation, and the GIL helpers.
//
// The binding is thin: every function calls the library; what lives here only converts
// arguments and results between Python and C++.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/dlpack.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr_py {

namespace nb = nanobind;

/// Any CPU tensor nanobind can take through DLPack (torch, NumPy, anything with __dlpack__).
using any_array = nb::ndarray<nb::device::cpu>;

/// A dcr dtype from its safetensors name ("BF16", "F32", ...); invalid_argument naming `what`.
inline dcr::dtype dtype_from_name(const std::string& name, const std::string& what) {
  const auto t = dcr::parse_dtype(name);
  DCR_EXPECTS(t.has_value(), dcr::errc::invalid_argument,
              what + ": unknown dtype '" + name +
                  "' (expected a safetensors name: BF16, F16, F32, F64, F8_E4M3, F8_E5M2, I8, U8, "
                  "I16, U16, I32, U32, I64, U64, BOOL)");
  return *t;
}

inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The DLTensor nanobind imported, as the C struct dcr/dlpack.hpp reads.
inline DLTensor dltensor_of(const any_array& a) {
  DLTensor t{};
  t.data = const_cast<void*>(a.data());
  t.device.device_type = static_cast<DLDeviceType>(a.device_type());
  t.device.device_id = a.device_id();
  t.ndim = static_cast<std::int32_t>(a.ndim());
  t.dtype.code = a.dtype().code;
  t.dtype.bits = a.dtype().bits;
  t.dtype.lanes = a.dtype().lanes;
  t.shape = const_cast<std::int64_t*>(a.shape_ptr());
  t.strides = const_cast<std::int64_t*>(a.stride_ptr());
  t.byte_offset = 0;
  return t;
}

/// The stored bytes of a contiguous CPU tensor whose dtype is `expected` (or whose words have
/// its width when `words_only`: NumPy's bfloat16 and float8 arrays arrive as unsigned words,
/// the Python layer vouches for their dtype) and whose element count is `elements`.
/// Throws dcr::error naming `what` otherwise. Zero copies: the span aliases the tensor.
inline std::span<const std::byte> tensor_bytes(const any_array& a, dcr::dtype expected,
                                               std::uint64_t elements, const std::string& what,
                                               bool words_only = false) {
  const DLTensor t = dltensor_of(a);
  const auto got = dcr::dtype_of(t.dtype);
  if (words_only) {
    DCR_EXPECTS(t.dtype.lanes == 1 && t.dtype.bits == 8 * dcr::dtype_size(expected),
                dcr::errc::dtype_mismatch,
                what + ": " + std::to_string(t.dtype.bits) + "-bit elements, expected " +
                    std::string(dcr::dtype_name(expected)));
  } else {
    DCR_EXPECTS(got.has_value() && *got == expected, dcr::errc::dtype_mismatch,
                what + ": dtype " + (got ? std::string(dcr::dtype_name(*got)) : std::string("?")) +
                    ", expected " + std::string(dcr::dtype_name(expected)));
  }
  const auto view = dcr::visit_word(dcr::dtype_size(expected), [&](auto w) {
    using W = decltype(w);
    const auto v = dcr::from_dlpack<W>(t);
    DCR_EXPECTS(v.is_contiguous(), dcr::errc::invalid_argument,
                what + ": tensor is not contiguous (row-major); pass .contiguous() or "
                       "numpy.ascontiguousarray()");
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                      static_cast<std::size_t>(v.size()) * sizeof(W));
  });
  const std::uint64_t n = view.size() / dcr::dtype_size(expected);
  DCR_EXPECTS(n == elements, dcr::errc::shape_mismatch,
              what + ": " + std::to_string(n) + " elements, expected " + std::to_string(elements));
  return view;
}

/// A tensor as passed from Python (a tuple): the array and whether it carries words of a dtype
/// NumPy cannot name (see tensor_bytes). The Python layer (dcr/__init__.py) makes them.
using tensor_arg = std::pair<any_array, bool>;

/// Spans of a list of tensors, checked against dtypes and element counts, named by `names`.
inline std::vector<std::span<const std::byte>> tensor_spans(
    const std::vector<tensor_arg>& tensors, std::span<const dcr::dtype> types,
    std::span<const std::uint64_t> elements, std::span<const std::string> names,
    const std::string& what) {
  DCR_EXPECTS(tensors.size() == types.size(), dcr::errc::invalid_argument,
              what + ": " + std::to_string(tensors.size()) + " tensors given, expected " +
                  std::to_string(types.size()));
  std::vector<std::span<const std::byte>> out;
  out.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    out.push_back(tensor_bytes(tensors[i].first, types[i], elements[i],
                               what + ": shard '" + names[i] + "'", tensors[i].second));
  return out;
}

/// "Type: message" of a Python exception caught in a callback (GIL held), without traceback.
inline std::string python_error_text(const nb::python_error& e) {
  std::string type = nb::cast<std::string>(nb::str(e.type().attr("__name__")));
  return type + ": " + nb::cast<std::string>(nb::str(e.value()));
}

void bind_core(nb::module_& m);
void bind_owner(nb::module_& m);
void bind_receiver(nb::module_& m);
void bind_protocol(nb::module_& m);
void bind_io(nb::module_& m);
void bind_baseline(nb::module_& m);

}  // namespace dcr_py

