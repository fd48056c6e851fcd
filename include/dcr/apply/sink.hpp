// dcr/apply/sink.hpp: the sinks a loader's final storage copies go through.
//
// `dense_sink` copies every element: running the engine's loader with it IS the dense refit.
// `delta_sink` applies one decoded item in place: it writes only the destination elements whose
// canonical element has a record, and leaves every other destination element untouched. That is
// what makes an in-place apply exact: a destination without a record keeps its committed bits,
// which already equal the dense refit's bits because its canonical element did not change.
//
// How the delta sink finds the changed elements of a copy: the loader is handed a view over a
// scratch buffer laid out as the canonical tensor (contiguous, row-major), so a scratch element's
// offset from the scratch base IS its canonical flat index. Every src view the loader passes to
// copy() is a strided view of that scratch; the sink inverts it exactly by address: for each
// active canonical index inside the view's address window it decomposes the offset over the
// view's strides into logical coordinates and writes the destination element with the same
// coordinates. No placeholder values are involved, so NaN payloads, -0 and every other bit
// pattern are applied exactly, and the scratch never needs the item's values.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// What one load() of one tensor did, as seen by a sink. `tensor` views the canonical tensor's
/// name and lives as long as that canonical_tensor (normally the registry).
struct load_record {
  std::string_view tensor;
  std::uint64_t copies = 0;    ///< copy() calls, including empty views
  std::uint64_t elements = 0;  ///< destination elements written
  bool skipped = false;        ///< the loader called skip(t): this rank holds nothing of t
};

namespace detail {

/// Ends one load(): a loader must either copy or skip each tensor, never both, never neither.
/// An item without an intercepted copy and without an explicit skip would silently be dropped.
inline void check_copy_or_skip(const load_record& r) {
  DCR_EXPECTS(r.copies > 0 || r.skipped, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) +
                  "' neither copied nor skipped it (every tensor needs copies or an explicit "
                  "sink.skip(t))");
}

inline void check_copy_after_skip(const load_record& r) {
  DCR_EXPECTS(!r.skipped, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) +
                  "' both copied and skipped it");
}

inline void check_skip_target(const load_record& r, const canonical_tensor& t) {
  DCR_EXPECTS(t.name == r.tensor, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) + "' skipped tensor '" +
                  t.name + "' instead");
  DCR_EXPECTS(r.copies == 0, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) +
                  "' both copied and skipped it");
}

template <class W, class U>
void check_copy_shapes(const load_record& r, const tensor_view<W>& dst,
                       const tensor_view<U>& src) {
  DCR_EXPECTS(dst.same_shape(src), errc::shape_mismatch,
              "dcr loader: copy #" + std::to_string(r.copies) + " of tensor '" +
                  std::string(r.tensor) + "' has dst and src views of different shapes");
}

/// Whether a strided view is provably non-overlapping: ordered by |stride|, each dimension's
/// stride exceeds the largest offset the smaller-stride dimensions reach. Every view built by
/// slice/select/transpose/reshape from a contiguous tensor qualifies; a broadcast (stride 0,
/// extent > 1) does not. The same condition makes the offset decomposition below unique.
template <class T>
constexpr bool is_non_overlapping(const tensor_view<T>& v) noexcept {
  std::array<std::int64_t, max_rank> s{};
  std::array<std::int64_t, max_rank> e{};
  int n = 0;
  for (int d = 0; d < v.rank(); ++d) {
    if (v.extent(d) == 0) return true;  // no elements, nothing can overlap
    if (v.extent(d) == 1) continue;
    s[n] = v.stride(d) < 0 ? -v.stride(d) : v.stride(d);
    e[n] = v.extent(d);
    ++n;
  }
  // Insertion sort by |stride|: rank <= 8.
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && s[j - 1] > s[j]; --j) {
      std::swap(s[j - 1], s[j]);
      std::swap(e[j - 1], e[j]);
    }
  std::int64_t reach = 0;
  for (int i = 0; i < n; ++i) {
    if (s[i] <= reach) return false;
    reach += s[i] * (e[i] - 1);
  }
  return true;
}

/// The exact inverse of one copy's src view: relative scratch offset -> dst element offset.
/// Trivially copyable, so a device kernel can take it by value.
///
/// Dimensions with extent > 1 are kept, ordered by |src stride| descending. A dimension with a
/// negative src stride is walked backwards from the view's lowest address: quotient q stands for
/// coordinate extent-1-q, folded into `dst_origin` and a negated `dst_step`.
struct view_inverse {
  int dims = 0;
  std::array<std::int64_t, max_rank> src_stride{};  ///< |src stride|, descending
  std::array<std::int64_t, max_rank> extent{};
  std::array<std::int64_t, max_rank> dst_step{};    ///< dst offset per quotient unit
  std::int64_t dst_origin = 0;  ///< dst offset of the element at the view's lowest address
  std::int64_t min_offset = 0;  ///< offset of the lowest address from src.data() (<= 0)
  std::int64_t span = 0;        ///< largest offset from the lowest address
  bool identity = false;        ///< gapless src laid out exactly like dst: dst offset == rel

  /// Builds the inverse of a non-empty, non-overlapping src view (checked by the caller).
  template <class W, class U>
  static view_inverse of(const tensor_view<W>& dst, const tensor_view<U>& src) noexcept {
    view_inverse inv;
    for (int d = 0; d < src.rank(); ++d) {
      const std::int64_t e = src.extent(d);
      if (e == 1) continue;
      std::int64_t s = src.stride(d);
      std::int64_t ds = dst.stride(d);
      if (s < 0) {
        inv.min_offset += (e - 1) * s;
        inv.dst_origin += (e - 1) * ds;
        s = -s;
        ds = -ds;
      }
      inv.src_stride[inv.dims] = s;
      inv.extent[inv.dims] = e;
      inv.dst_step[inv.dims] = ds;
      inv.span += (e - 1) * s;
      ++inv.dims;
    }
    for (int i = 1; i < inv.dims; ++i)
      for (int j = i; j > 0 && inv.src_stride[j - 1] < inv.src_stride[j]; --j) {
        std::swap(inv.src_stride[j - 1], inv.src_stride[j]);
        std::swap(inv.extent[j - 1], inv.extent[j]);
        std::swap(inv.dst_step[j - 1], inv.dst_step[j]);
      }
    // Gapless (span + 1 == size) and dst steps equal src strides: rel maps to itself.
    std::int64_t size = 1;
    bool same = inv.dst_origin == 0;
    for (int i = 0; i < inv.dims; ++i) {
      size *= inv.extent[i];
      same = same && inv.dst_step[i] == inv.src_stride[i];
    }
    inv.identity = same && inv.span + 1 == size;
    return inv;
  }

  /// If relative offset `rel` (in [0, span]) is an element of the view, stores the matching
  /// dst offset (from dst.data()) and returns true. O(dims). The non-overlap condition makes the
  /// greedy quotient at each stride the only possible coordinate.
  DCR_HOST_DEVICE constexpr bool locate(std::int64_t rel, std::int64_t& dst_off) const noexcept {
    if (identity) {
      dst_off = rel;
      return true;
    }
    std::int64_t off = dst_origin;
    for (int i = 0; i < dims; ++i) {
      const std::int64_t q = rel / src_stride[i];
      if (q >= extent[i]) return false;
      rel -= q * src_stride[i];
      off += q * dst_step[i];
    }
    if (rel != 0) return false;
    dst_off = off;
    return true;
  }
};

}  // namespace detail

/// Plain copy of every element src -> dst: the dense refit through the engine's loader.
///
/// Bracket each load() with begin(t) / finish(); finish() checks that the loader copied or
/// skipped t and appends the tensor's load_record to log(), so a caller can see which tensors
/// this rank loaded and which it skipped. dense_sink accepts src views from anywhere (a dense
/// refit may legitimately copy from temporaries); the delta path is what forbids it.
template <storage_word W>
class dense_sink {
 public:
  using sink_concept = sink_tag;
  using word_type = W;

  /// Starts the load of `t` (which must outlive the record).
  void begin(const canonical_tensor& t) { current_ = load_record{t.name, 0, 0, false}; }

  /// Copies every element. dst and src must have the same extents (errc::shape_mismatch).
  void copy(tensor_view<W> dst, tensor_view<const W> src) {
    detail::check_copy_after_skip(current_);
    detail::check_copy_shapes(current_, dst, src);
    copy_elements(dst, src);
    ++current_.copies;
    current_.elements += static_cast<std::uint64_t>(dst.size());
  }

  /// Records that this rank holds nothing of `t` (must be the tensor being loaded).
  void skip(const canonical_tensor& t) {
    detail::check_skip_target(current_, t);
    current_.skipped = true;
  }

  /// Ends the load: checks copy-or-skip, logs and returns the record.
  load_record finish() {
    detail::check_copy_or_skip(current_);
    log_.push_back(current_);
    return current_;
  }

  /// Every finished load since construction or clear_log(), in order.
  [[nodiscard]] std::span<const load_record> log() const noexcept { return log_; }
  void clear_log() noexcept { log_.clear(); }

 private:
  load_record current_;
  std::vector<load_record> log_;
};

static_assert(sink_for<dense_sink<std::uint16_t>, std::uint16_t>);

/// The two passes of an in-place apply (see item_applier): `check` validates every copy and
/// counts writes without touching storage; `write` performs the writes.
enum class delta_pass : std::uint8_t { check, write };

/// Applies one item in place at the loader's final storage copies.
///
/// begin() binds the item: the canonical tensor, the base of the scratch view the loader is
/// handed (contiguous row-major of the canonical shape, so scratch offset == canonical flat
/// index), the item's sorted active indices, its values and encoding (any supported one; the
/// per-element rule comes from the encoding's policy type in dcr/codec/values.hpp).
/// For each copy(dst, src) the sink
///   1. rejects (errc::unsupported_loader_path, naming the tensor) a src that is not a
///      non-overlapping strided view lying inside the bound scratch tensor;
///   2. narrows the active list to the view's address window by binary search;
///   3. for each active index in the window, decomposes its offset over the src strides and,
///      if it is an element of the view, updates the dst element at the same coordinates.
/// Cost per copy: O(log active + active_in_window * rank); views are never scanned.
/// Elements without a record are never written.
///
/// Non-idempotent items (xor): a canonical element may be replicated into several different
/// destinations, but the same destination element must not be written twice (a second xor
/// would undo the first). When the loader issues more than one copy, or a dst view that may overlap itself,
/// the check pass collects every written destination address and finish() rejects repeats
/// (a sort of the item's writes, in a buffer reused across items).
/// Overwrite items may write a destination more than once (last write wins, as in the dense
/// refit).
template <storage_word W>
class delta_sink {
 public:
  using sink_concept = sink_tag;
  using word_type = W;

  /// Binds one item for one load(). `active` must be sorted strictly increasing and `values`
  /// hold one word per active index (the caller validates items). Throws unsupported_version
  /// for an encoding this build does not implement. The spans and `t` must stay alive until
  /// finish().
  void begin(const canonical_tensor& t, const W* scratch, std::span<const std::uint64_t> active,
             std::span<const W> values, encoding enc, delta_pass pass) {
    DCR_EXPECTS(is_supported_encoding(enc), errc::unsupported_version,
                "dcr apply: tensor '" + t.name + "': encoding " +
                    std::to_string(static_cast<int>(enc)) + " is not applied by delta_sink");
    DCR_EXPECTS(values.size() == active.size(), errc::invalid_argument,
                "dcr apply: tensor '" + t.name + "': value count differs from index count");
    current_ = load_record{t.name, 0, 0, false};
    base_ = scratch;
    numel_ = t.numel();
    active_ = active;
    values_ = values;
    enc_ = enc;
    idempotent_ = visit_encoding(enc, [](auto e) { return decltype(e)::idempotent; });
    pass_ = pass;
    recording_ = false;
    has_first_ = false;
    written_.clear();
  }

  /// Applies the bound item's records that fall inside `src` to the matching `dst` elements.
  void copy(tensor_view<W> dst, tensor_view<const W> src) {
    detail::check_copy_after_skip(current_);
    detail::check_copy_shapes(current_, dst, src);
    ++current_.copies;
    if (src.size() == 0) return;  // no elements: nothing to locate, nothing outside the tensor
    DCR_EXPECTS(detail::is_non_overlapping(src), errc::unsupported_loader_path,
                "dcr apply: copy #" + std::to_string(current_.copies) + " of tensor '" +
                    std::string(current_.tensor) +
                    "' reads an overlapping src view (broadcast or aliased strides)");
    const auto inv = detail::view_inverse::of(dst, src);
    // Offset of the view's lowest element from the scratch base, computed on addresses so a
    // view of some other buffer is detected rather than being undefined pointer arithmetic.
    const auto byte_diff = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(src.data()) -
                                                     reinterpret_cast<std::uintptr_t>(base_));
    const std::int64_t first = byte_diff / static_cast<std::int64_t>(sizeof(W)) + inv.min_offset;
    const bool inside = byte_diff % static_cast<std::int64_t>(sizeof(W)) == 0 && first >= 0 &&
                        first <= numel_ - 1 - inv.span;
    DCR_EXPECTS(inside, errc::unsupported_loader_path,
                "dcr apply: copy #" + std::to_string(current_.copies) + " of tensor '" +
                    std::string(current_.tensor) +
                    "' reads from outside the tensor the loader was given (src must be a view "
                    "of the src argument, not a temporary)");

    const auto lo = std::lower_bound(active_.begin(), active_.end(),
                                     static_cast<std::uint64_t>(first));
    const auto hi = std::upper_bound(lo, active_.end(), static_cast<std::uint64_t>(first + inv.span));
    const std::size_t k_begin = static_cast<std::size_t>(lo - active_.begin());
    const std::size_t k_end = static_cast<std::size_t>(hi - active_.begin());
    if (pass_ == delta_pass::check) {
      check_range(dst, inv, first, k_begin, k_end);
    } else {
      visit_encoding(enc_, [&](auto e) {
        using E = decltype(e);
        write_range(dst, inv, first, k_begin, k_end, [](W r, W v) { return E::apply(r, v); });
      });
    }
  }

  /// Records that this rank holds nothing of `t` (must be the bound tensor).
  void skip(const canonical_tensor& t) {
    detail::check_skip_target(current_, t);
    current_.skipped = true;
  }

  /// Ends the load: checks copy-or-skip and, on the check pass of an xor item, that no
  /// destination element was written twice. Returns the record (elements = writes).
  load_record finish() {
    detail::check_copy_or_skip(current_);
    if (recording_ && written_.size() > 1) {
      std::sort(written_.begin(), written_.end());
      DCR_EXPECTS(std::adjacent_find(written_.begin(), written_.end()) == written_.end(),
                  errc::unsupported_loader_path,
                  "dcr apply: xor item of tensor '" + std::string(current_.tensor) +
                      "' writes the same destination element twice (overlapping loader "
                      "writes; send this tensor as overwrite)");
    }
    return current_;
  }

 private:
  // Counts the copy's writes. For xor items it also collects destination addresses, lazily:
  // a load with a single copy into a non-overlapping dst cannot write an element twice, so the
  // first such copy is only remembered, and replayed into `written_` once a second copy (or a
  // possibly self-overlapping dst) makes the exact check necessary.
  void check_range(const tensor_view<W>& dst, const detail::view_inverse& inv, std::int64_t first,
                   std::size_t k_begin, std::size_t k_end) {
    if (!idempotent_ && !recording_) {
      if (current_.copies == 1 && detail::is_non_overlapping(dst)) {
        first_copy_ = pending_copy{inv, dst.data(), first, k_begin, k_end};
        has_first_ = true;
      } else {
        recording_ = true;
        if (has_first_)
          collect(first_copy_.inv, first_copy_.dst, first_copy_.first, first_copy_.k_begin,
                  first_copy_.k_end, true);
      }
    }
    current_.elements += collect(inv, dst.data(), first, k_begin, k_end, recording_);
  }

  std::uint64_t collect(const detail::view_inverse& inv, W* dst, std::int64_t first,
                        std::size_t k_begin, std::size_t k_end, bool record) {
    std::uint64_t hits = 0;
    for (std::size_t k = k_begin; k < k_end; ++k) {
      std::int64_t off = 0;
      if (!inv.locate(static_cast<std::int64_t>(active_[k]) - first, off)) continue;
      ++hits;
      if (record) written_.push_back(reinterpret_cast<std::uintptr_t>(dst + off));
    }
    return hits;
  }

  template <class Op>
  void write_range(const tensor_view<W>& dst, const detail::view_inverse& inv, std::int64_t first,
                   std::size_t k_begin, std::size_t k_end, Op op) {
    W* const out = dst.data();
    for (std::size_t k = k_begin; k < k_end; ++k) {
      std::int64_t off = 0;
      if (!inv.locate(static_cast<std::int64_t>(active_[k]) - first, off)) continue;
      out[off] = op(out[off], values_[k]);
      ++current_.elements;
    }
  }

  load_record current_;
  const W* base_ = nullptr;
  std::int64_t numel_ = 0;
  std::span<const std::uint64_t> active_;
  std::span<const W> values_;
  encoding enc_ = encoding::overwrite;
  bool idempotent_ = true;  // a non-idempotent encoding must not write one destination twice
  delta_pass pass_ = delta_pass::check;
  // Check pass of xor items: the destination addresses written, once recording is needed.
  struct pending_copy {
    detail::view_inverse inv;
    W* dst;
    std::int64_t first;
    std::size_t k_begin, k_end;
  };
  bool recording_ = false;
  bool has_first_ = false;
  pending_copy first_copy_{};
  std::vector<std::uintptr_t> written_;
};

static_assert(sink_for<delta_sink<std::uint16_t>, std::uint16_t>);

}  // namespace dcr
