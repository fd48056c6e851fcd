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
//
// Relation to the paper's placeholder scatter: the paper scatters an item's values into the
// scratch, fills inactive positions with a placeholder (0 for xor masks, NaN for overwrites) and
// derives each copy's active mask from the copy's input values, which needs a placeholder that
// no real value equals and a loader that keeps it intact. Locating by address answers the same
// question (which elements of this copy have a record) from the view geometry alone, so it is
// exact for every bit pattern and does not depend on what the loader does to values.
//
// Both sinks accept the transformed copy `copy(dst, src, transform)` (dcr/apply/transform.hpp):
// dense_sink stores transform(word) for every element; delta_sink stores transform(value) for
// overwrite records and refuses xor/ulp records on a non-empty copy that does not preserve bits
// (an empty copy, e.g. of a rank whose share is empty, writes nothing and is not refused).
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/apply/record.hpp"
#include "dcr/apply/transform.hpp"
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

/// One destination element written by an in-place apply, kept when post-apply checks are on
/// (apply_options::verify): where, what was there before, and what was applied. Words are
/// zero-extended to 64 bits.
struct write_record {
  std::byte* dst = nullptr;    ///< the destination element
  std::uint64_t before = 0;    ///< its bits before the write
  std::uint64_t value = 0;     ///< the item's value for the element (mask, delta or new bits)
  std::uint64_t index = 0;     ///< canonical flat index of the element
  std::string_view tensor;     ///< canonical tensor name (lives in the registry)
  encoding enc = encoding::overwrite;
  element_transform transform{};
  std::uint8_t src_bytes = 0;  ///< canonical word width
  std::uint8_t dst_bytes = 0;  ///< storage word width
};

namespace detail {
template <storage_word W>
W load_word(const std::byte* p) noexcept {
  W w;
  std::memcpy(&w, p, sizeof(W));
  return w;
}
std::uint64_t load_word_bytes(const std::byte* p, std::size_t bytes) noexcept;
}  // namespace detail

namespace detail {

/// Ends one load(): a loader must either copy or skip each tensor, never both, never neither.
/// An item without an intercepted copy and without an explicit skip would silently be dropped.
void check_copy_or_skip(const load_record& r);

void check_copy_after_skip(const load_record& r);

void check_skip_target(const load_record& r, const canonical_tensor& t);

/// "copy #n of tensor 'name'" for the copy being made (n counts from 1).
std::string copy_where(const load_record& r);

template <class W, class U>
void check_copy_shapes(const load_record& r, const tensor_view<W>& dst,
                       const tensor_view<U>& src) {
  DCR_EXPECTS(dst.same_shape(src), errc::shape_mismatch,
              copy_where(r) + " has dst and src views of different shapes");
}

/// Whether a strided layout (extents and strides, `n` dimensions) is provably non-overlapping:
/// ordered by |stride|, each dimension's stride exceeds the largest offset the smaller-stride
/// dimensions reach. Every view built by slice/select/transpose/reshape from a contiguous tensor
/// qualifies; a broadcast (stride 0, extent > 1) does not. The same condition makes the offset
/// decomposition of view_inverse unique.
constexpr bool is_non_overlapping_layout(const std::int64_t* extents, const std::int64_t* strides,
                                         int rank) noexcept {
  std::array<std::int64_t, max_rank> s{};
  std::array<std::int64_t, max_rank> e{};
  int n = 0;
  for (int d = 0; d < rank; ++d) {
    if (extents[d] == 0) return true;  // no elements, nothing can overlap
    if (extents[d] == 1) continue;
    s[n] = strides[d] < 0 ? -strides[d] : strides[d];
    e[n] = extents[d];
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

template <class T>
constexpr bool is_non_overlapping(const tensor_view<T>& v) noexcept {
  return is_non_overlapping_layout(v.extents().data(), v.strides().data(), v.rank());
}

}  // namespace detail

namespace detail {

/// Where one copy's src lies inside the scratch tensor: its inverse and the canonical index of
/// its lowest element (`first`; the view covers [first, first + inv.span]).
struct located_copy {
  view_inverse inv;
  std::int64_t first = 0;
};

/// Checks that a non-empty src view is a non-overlapping strided view lying inside the scratch
/// tensor [base, base + numel) and inverts it. Throws errc::unsupported_loader_path naming the
/// tensor and the copy otherwise. Works on addresses, so a view of some other buffer is detected
/// rather than being undefined pointer arithmetic.
template <class D, storage_word W>
located_copy locate_copy(const load_record& r, const W* base, std::int64_t numel,
                         const tensor_view<D>& dst, const tensor_view<const W>& src) {
  DCR_EXPECTS(is_non_overlapping(src), errc::unsupported_loader_path,
              copy_where(r) + " reads an overlapping src view (broadcast or aliased strides)");
  located_copy c;
  c.inv = view_inverse::of(dst, src);
  const auto byte_diff = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(src.data()) -
                                                   reinterpret_cast<std::uintptr_t>(base));
  c.first = byte_diff / static_cast<std::int64_t>(sizeof(W)) + c.inv.min_offset;
  const bool inside = byte_diff % static_cast<std::int64_t>(sizeof(W)) == 0 && c.first >= 0 &&
                      c.first <= numel - 1 - c.inv.span;
  DCR_EXPECTS(inside, errc::unsupported_loader_path,
              copy_where(r) +
                  " reads from outside the tensor the loader was given (src must be a view "
                  "of the src argument, not a temporary)");
  return c;
}

/// The placement record of one located copy into `dst` (words of `dst_bytes`, through
/// `transform`) of tensor `tensor`; with `finalized`, its divisors are set (ready to apply).
placement record_of_copy(const located_copy& c, std::byte* dst, element_transform transform,
                                std::size_t dst_bytes, tensor_id tensor, bool finalized) noexcept;

/// Copies every element src -> dst through transform T (dense refit of a transformed copy).
template <class T, storage_word D, storage_word W>
void copy_transformed(tensor_view<D> dst, tensor_view<const W> src) {
  const std::int64_t n = dst.size();
  if (n == 0) return;
  const int last = dst.rank() - 1;
  const std::int64_t inner = last >= 0 ? dst.extent(last) : 1;
  const std::int64_t ds = last >= 0 ? dst.stride(last) : 1;
  const std::int64_t ss = last >= 0 ? src.stride(last) : 1;
  for (std::int64_t row = 0; row < n / inner; ++row) {
    D* d = dst.data() + dst.offset_of_logical(row * inner);
    const W* s = src.data() + src.offset_of_logical(row * inner);
    for (std::int64_t k = 0; k < inner; ++k) d[k * ds] = T::apply(s[k * ss]);
  }
}

}  // namespace detail

/// Plain copy of every element src -> dst: the dense refit through the engine's loader.
///
/// Bracket each load() with begin(t) / finish(); finish() checks that the loader copied or
/// skipped t and appends the tensor's load_record to log(), so a caller can see which tensors
/// this rank loaded and which it skipped. dense_sink accepts src views from anywhere (a dense
/// refit may legitimately copy from temporaries); the delta paths are what forbid it.
template <storage_word W>
class dense_sink {
 public:
  using sink_concept = sink_tag;
  using word_type = W;

  /// Starts the load of `t` (which must outlive the record).
  void begin(const canonical_tensor& t) {
    current_ = load_record{t.name, 0, 0, false};
    type_ = t.type;
  }

  /// Copies every element. dst and src must have the same extents (errc::shape_mismatch).
  void copy(tensor_view<W> dst, tensor_view<const W> src) {
    detail::check_copy_after_skip(current_);
    detail::check_copy_shapes(current_, dst, src);
    copy_elements(dst, src);
    ++current_.copies;
    current_.elements += static_cast<std::uint64_t>(dst.size());
  }

  /// Copies every element through `transform` into storage words D. Throws dtype_mismatch when
  /// the transform does not read the tensor's dtype or write D-wide words.
  template <storage_word D>
  void copy(tensor_view<D> dst, tensor_view<const W> src, element_transform transform);

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
  dtype type_ = dtype::u8;
  std::vector<load_record> log_;
};

static_assert(sink_for<dense_sink<std::uint16_t>, std::uint16_t>);

/// The two passes of an in-place apply (see item_applier): `check` validates every copy and
/// counts writes without touching storage; `write` performs the writes.
enum class delta_pass : std::uint8_t { check, write };

/// Applies one item in place at the loader's final storage copies: the general apply path.
///
/// begin() binds the item: the canonical tensor, the base of the scratch view the loader is
/// handed (contiguous row-major of the canonical shape, so scratch offset == canonical flat
/// index), the item's sorted active indices, its values and encoding (any supported one; the
/// per-element rule comes from the encoding's policy type in dcr/codec/values.hpp).
/// For each copy(dst, src[, transform]) the sink
///   1. rejects (errc::unsupported_loader_path, naming the tensor) a src that is not a
///      non-overlapping strided view lying inside the bound scratch tensor, and a non-empty
///      copy through a transform that does not preserve bits on an item whose encoding needs
///      committed bits (xor, ulp); an empty copy places nothing and sets no such condition;
///   2. narrows the active list to the view's address window by binary search;
///   3. for each active index in the window, decomposes its offset over the src strides and,
///      if it is an element of the view, updates the dst element at the same coordinates
///      (overwrite through a transform stores transform(value)).
/// Cost per copy: O(log active + active_in_window * rank); views are never scanned.
/// Elements without a record are never written.
///
/// Non-idempotent items (xor, ulp): a canonical element may be replicated into several different
/// destinations, but the same destination element must not be written twice (a second xor
/// would undo the first). When the loader issues more than one copy, or a dst view that may
/// overlap itself, the check pass collects every written destination address and finish()
/// rejects repeats (a sort of the item's writes, in a buffer reused across items).
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
  /// finish(). When `log` is not null, the write pass appends one write_record per written
  /// element (post-apply checks).
  void begin(const canonical_tensor& t, const W* scratch, std::span<const std::uint64_t> active,
             std::span<const W> values, encoding enc, delta_pass pass,
             std::vector<write_record>* log = nullptr) {
    DCR_EXPECTS(is_supported_encoding(enc), errc::unsupported_version,
                "dcr apply: tensor '" + t.name + "': encoding " +
                    std::to_string(static_cast<int>(enc)) + " is not applied by delta_sink");
    DCR_EXPECTS(values.size() == active.size(), errc::invalid_argument,
                "dcr apply: tensor '" + t.name + "': value count differs from index count");
    current_ = load_record{t.name, 0, 0, false};
    type_ = t.type;
    base_ = scratch;
    numel_ = t.numel();
    active_ = active;
    values_ = values;
    enc_ = enc;
    idempotent_ = visit_encoding(enc, [](auto e) { return decltype(e)::idempotent; });
    needs_bits_ = visit_encoding(enc, [](auto e) { return decltype(e)::needs_committed_bits; });
    pass_ = pass;
    log_ = log;
    recording_ = false;
    has_first_ = false;
    written_.clear();
  }

  /// Applies the bound item's records that fall inside `src` to the matching `dst` elements.
  void copy(tensor_view<W> dst, tensor_view<const W> src) {
    copy(dst, src, element_transform::identity());
  }

  /// The same through an element transform into storage words D (overwrite items only, unless
  /// the transform is the identity).
  template <storage_word D>
  void copy(tensor_view<D> dst, tensor_view<const W> src, element_transform transform);

  /// Records that this rank holds nothing of `t` (must be the bound tensor).
  void skip(const canonical_tensor& t) {
    detail::check_skip_target(current_, t);
    current_.skipped = true;
  }

  /// Ends the load: checks copy-or-skip and, on the check pass of an xor/ulp item, that no
  /// destination element was written twice. Returns the record (elements = writes).
  load_record finish() {
    detail::check_copy_or_skip(current_);
    if (recording_ && written_.size() > 1) {
      std::sort(written_.begin(), written_.end());
      DCR_EXPECTS(std::adjacent_find(written_.begin(), written_.end()) == written_.end(),
                  errc::unsupported_loader_path,
                  "dcr apply: " + encoding_name() + " item of tensor '" +
                      std::string(current_.tensor) +
                      "' writes the same destination element twice (overlapping loader "
                      "writes; send this tensor as overwrite)");
    }
    return current_;
  }

 private:
  std::string encoding_name() const {
    return enc_ == encoding::xor_mask ? "xor"
           : enc_ == encoding::ulp    ? "ulp"
                                      : "encoding " + std::to_string(static_cast<int>(enc_));
  }

  // Counts the copy's writes. For non-idempotent items it also collects destination addresses,
  // lazily: a load with a single copy into a non-overlapping dst cannot write an element twice,
  // so the first such copy is only remembered, and replayed into `written_` once a second copy
  // (or a possibly self-overlapping dst) makes the exact check necessary.
  void check_range(std::byte* dst, std::size_t dst_bytes, bool dst_non_overlapping,
                   const view_inverse& inv, std::int64_t first, std::size_t k_begin,
                   std::size_t k_end) {
    if (!idempotent_ && !recording_) {
      if (current_.copies == 1 && dst_non_overlapping) {
        first_copy_ = pending_copy{inv, dst, dst_bytes, first, k_begin, k_end};
        has_first_ = true;
      } else {
        recording_ = true;
        if (has_first_)
          collect(first_copy_.inv, first_copy_.dst, first_copy_.dst_bytes, first_copy_.first,
                  first_copy_.k_begin, first_copy_.k_end, true);
      }
    }
    current_.elements += collect(inv, dst, dst_bytes, first, k_begin, k_end, recording_);
  }

  std::uint64_t collect(const view_inverse& inv, std::byte* dst, std::size_t dst_bytes,
                        std::int64_t first, std::size_t k_begin, std::size_t k_end, bool record) {
    std::uint64_t hits = 0;
    for (std::size_t k = k_begin; k < k_end; ++k) {
      std::int64_t off = 0;
      if (!inv.locate(static_cast<std::int64_t>(active_[k]) - first, off)) continue;
      ++hits;
      if (record)
        written_.push_back(reinterpret_cast<std::uintptr_t>(dst) +
                           static_cast<std::uintptr_t>(off * static_cast<std::int64_t>(dst_bytes)));
    }
    return hits;
  }

  load_record current_;
  dtype type_ = dtype::u8;
  const W* base_ = nullptr;
  std::int64_t numel_ = 0;
  std::span<const std::uint64_t> active_;
  std::span<const W> values_;
  encoding enc_ = encoding::overwrite;
  bool idempotent_ = true;   // a non-idempotent encoding must not write one destination twice
  bool needs_bits_ = false;  // the encoding is exact only on a bit-preserving path
  delta_pass pass_ = delta_pass::check;
  std::vector<write_record>* log_ = nullptr;
  // Check pass of non-idempotent items: the destination addresses written, once needed.
  struct pending_copy {
    view_inverse inv;
    std::byte* dst;
    std::size_t dst_bytes;
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

#include "dcr/detail/apply/sink.inl"
