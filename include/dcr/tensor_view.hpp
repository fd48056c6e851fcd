// dcr/tensor_view.hpp: a non-owning, trivially copyable strided view of stored words.
//
// `tensor_view<W>` is what every stage of dcr reads and writes: a pointer to words of type W
// (const-qualified for read-only views), up to `max_rank` extents and strides counted in
// elements, like a dynamic-rank mdspan with layout_stride. It never owns memory, so it can be
// passed by value into kernels. Slicing, selecting and permuting return new views of the same
// storage; this is how engine loaders describe their final storage copies to a dcr sink.
//
// User tensor types adapt through the `tensor_like` concept (data(), rank(), extent(i),
// stride(i)); DLPack tensors through dcr/dlpack.hpp.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>

#include "dcr/config.hpp"
#include "dcr/error.hpp"
#include "dcr/shape.hpp"

namespace dcr {

/// Largest rank a tensor_view can describe.
inline constexpr int max_rank = 8;

/// Extents or strides of a view, in elements.
using index_array = std::array<std::int64_t, max_rank>;

template <class T>
class tensor_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr tensor_view() noexcept = default;

  /// A view over `data` with explicit extents and strides (elements, not bytes).
  DCR_HOST_DEVICE constexpr tensor_view(T* data, int rank, const index_array& extents,
                                        const index_array& strides) noexcept
      : data_(data), rank_(rank), extents_(extents), strides_(strides) {}

  /// A contiguous row-major view of `shape` over `data`. Throws errc::invalid_argument for a
  /// rank above max_rank or a negative extent, errc::overflow for a shape whose element count
  /// does not fit std::int64_t.
  static tensor_view contiguous(T* data, std::span<const std::int64_t> shape) {
    DCR_EXPECTS(shape.size() <= static_cast<std::size_t>(max_rank), errc::invalid_argument,
                "tensor_view: rank exceeds dcr::max_rank");
    (void)expect_numel(shape, 1, "tensor_view");
    tensor_view v;
    v.data_ = data;
    v.rank_ = static_cast<int>(shape.size());
    // Unsigned: the strides of an empty view ([0, 2^40, 2^40]) may wrap; they address nothing.
    std::uint64_t stride = 1;
    for (int d = v.rank_ - 1; d >= 0; --d) {
      v.extents_[d] = shape[d];
      v.strides_[d] = static_cast<std::int64_t>(stride);
      stride *= static_cast<std::uint64_t>(shape[d]);
    }
    return v;
  }
  static tensor_view contiguous(T* data, std::initializer_list<std::int64_t> shape) {
    return contiguous(data, std::span<const std::int64_t>(shape.begin(), shape.size()));
  }

  /// Implicit conversion from a mutable to a const view.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  DCR_HOST_DEVICE constexpr tensor_view(const tensor_view<U>& other) noexcept
      : data_(other.data()), rank_(other.rank()), extents_(other.extents()),
        strides_(other.strides()) {}

  DCR_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  DCR_HOST_DEVICE constexpr int rank() const noexcept { return rank_; }
  DCR_HOST_DEVICE constexpr std::int64_t extent(int d) const noexcept { return extents_[d]; }
  DCR_HOST_DEVICE constexpr std::int64_t stride(int d) const noexcept { return strides_[d]; }
  DCR_HOST_DEVICE constexpr const index_array& extents() const noexcept { return extents_; }
  DCR_HOST_DEVICE constexpr const index_array& strides() const noexcept { return strides_; }

  /// Number of elements.
  DCR_HOST_DEVICE constexpr std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank_; ++d) n *= extents_[d];
    return n;
  }

  /// True when elements are laid out densely in row-major order.
  DCR_HOST_DEVICE constexpr bool is_contiguous() const noexcept {
    std::int64_t expect = 1;
    for (int d = rank_ - 1; d >= 0; --d) {
      if (extents_[d] != 1 && strides_[d] != expect) return false;
      expect *= extents_[d];
    }
    return true;
  }

  /// Storage offset (elements from data()) of the element at row-major logical index `i`.
  DCR_HOST_DEVICE constexpr std::int64_t offset_of_logical(std::int64_t i) const noexcept {
    std::int64_t off = 0;
    for (int d = rank_ - 1; d >= 0; --d) {
      const std::int64_t e = extents_[d];
      off += (i % e) * strides_[d];
      i /= e;
    }
    return off;
  }

  /// Element at row-major logical index `i`.
  DCR_HOST_DEVICE constexpr T& operator[](std::int64_t i) const noexcept {
    return data_[offset_of_logical(i)];
  }

  /// Element at coordinates `c` (rank() entries).
  DCR_HOST_DEVICE constexpr T& at(const index_array& c) const noexcept {
    std::int64_t off = 0;
    for (int d = 0; d < rank_; ++d) off += c[d] * strides_[d];
    return data_[off];
  }

  /// The sub-view [start, start + length) along dimension `dim`.
  tensor_view slice(int dim, std::int64_t start, std::int64_t length) const {
    DCR_EXPECTS(dim >= 0 && dim < rank_, errc::invalid_argument, "tensor_view::slice: bad dim");
    DCR_EXPECTS(start >= 0 && length >= 0 && start + length <= extents_[dim], errc::out_of_range,
                "tensor_view::slice: range outside extent");
    tensor_view v = *this;
    v.data_ = data_ + start * strides_[dim];
    v.extents_[dim] = length;
    return v;
  }

  /// The view with dimension `dim` fixed at `index` (rank decreases by one).
  tensor_view select(int dim, std::int64_t index) const {
    DCR_EXPECTS(dim >= 0 && dim < rank_, errc::invalid_argument, "tensor_view::select: bad dim");
    DCR_EXPECTS(index >= 0 && index < extents_[dim], errc::out_of_range,
                "tensor_view::select: index outside extent");
    tensor_view v;
    v.data_ = data_ + index * strides_[dim];
    v.rank_ = rank_ - 1;
    for (int d = 0, o = 0; d < rank_; ++d) {
      if (d == dim) continue;
      v.extents_[o] = extents_[d];
      v.strides_[o] = strides_[d];
      ++o;
    }
    return v;
  }

  /// The view with dimensions `a` and `b` swapped (a transpose, no copy).
  tensor_view transpose(int a, int b) const {
    DCR_EXPECTS(a >= 0 && a < rank_ && b >= 0 && b < rank_, errc::invalid_argument,
                "tensor_view::transpose: bad dim");
    tensor_view v = *this;
    v.extents_[a] = extents_[b];
    v.extents_[b] = extents_[a];
    v.strides_[a] = strides_[b];
    v.strides_[b] = strides_[a];
    return v;
  }

  /// The same elements seen with another shape; requires a contiguous view.
  tensor_view reshape(std::span<const std::int64_t> shape) const {
    DCR_EXPECTS(is_contiguous(), errc::invalid_argument,
                "tensor_view::reshape: view is not contiguous");
    auto v = contiguous(data_, shape);
    DCR_EXPECTS(v.size() == size(), errc::shape_mismatch, "tensor_view::reshape: size differs");
    return v;
  }
  tensor_view reshape(std::initializer_list<std::int64_t> shape) const {
    return reshape(std::span<const std::int64_t>(shape.begin(), shape.size()));
  }

  /// Same-shaped, same-rank check.
  template <class U>
  constexpr bool same_shape(const tensor_view<U>& o) const noexcept {
    if (rank_ != o.rank()) return false;
    for (int d = 0; d < rank_; ++d)
      if (extents_[d] != o.extent(d)) return false;
    return true;
  }

 private:
  T* data_ = nullptr;
  int rank_ = 0;
  index_array extents_{};
  index_array strides_{};
};

static_assert(std::is_trivially_copyable_v<tensor_view<std::uint16_t>>);

/// A user tensor type dcr can view without copying.
template <class T>
concept tensor_like = requires(const T& t, int d) {
  { t.data() };
  { t.rank() } -> std::convertible_to<int>;
  { t.extent(d) } -> std::convertible_to<std::int64_t>;
  { t.stride(d) } -> std::convertible_to<std::int64_t>;
};

/// Views any tensor_like as a tensor_view of words W (the element size must match W).
template <class W, tensor_like T>
tensor_view<W> as_view(const T& t) {
  using E = std::remove_pointer_t<decltype(t.data())>;
  static_assert(sizeof(std::remove_cv_t<E>) == sizeof(std::remove_cv_t<W>),
                "dcr::as_view: element size differs from the word size");
  DCR_EXPECTS(t.rank() <= max_rank, errc::invalid_argument, "dcr::as_view: rank too large");
  index_array ext{}, str{};
  for (int d = 0; d < t.rank(); ++d) {
    ext[d] = t.extent(d);
    str[d] = t.stride(d);
  }
  return tensor_view<W>(reinterpret_cast<W*>(const_cast<std::remove_cv_t<E>*>(t.data())),
                        t.rank(), ext, str);
}

/// Copies every element of `src` into `dst` (same shape), in row-major logical order. Walks
/// rows of the innermost dimension, so strided views (slices, transposes) copy at near memcpy
/// speed when their innermost stride is 1.
template <class W>
void copy_elements(tensor_view<W> dst, tensor_view<const std::remove_const_t<W>> src) {
  DCR_EXPECTS(dst.same_shape(src), errc::shape_mismatch, "dcr::copy_elements: shapes differ");
  const std::int64_t n = dst.size();
  if (n == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    for (std::int64_t i = 0; i < n; ++i) dst.data()[i] = src.data()[i];
    return;
  }
  const int last = dst.rank() - 1;
  const std::int64_t inner = last >= 0 ? dst.extent(last) : 1;
  const std::int64_t ds = last >= 0 ? dst.stride(last) : 1;
  const std::int64_t ss = last >= 0 ? src.stride(last) : 1;
  for (std::int64_t row = 0; row < n / inner; ++row) {
    W* d = dst.data() + dst.offset_of_logical(row * inner);
    const auto* s = src.data() + src.offset_of_logical(row * inner);
    if (ds == 1 && ss == 1) {
      for (std::int64_t k = 0; k < inner; ++k) d[k] = s[k];
    } else {
      for (std::int64_t k = 0; k < inner; ++k) d[k * ds] = s[k * ss];
    }
  }
}

}  // namespace dcr
