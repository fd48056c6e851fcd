// dcr/apply/record.hpp: a compiled placement record and the one per-record apply step.
//
// A `placement` says where a strided set of canonical elements of one tensor lands in storage
// (dcr/apply/placement.hpp compiles them from the engine's loader at prewarm; the general path's
// sink builds one per loader copy; the whole-checkpoint tool uses one contiguous record per
// tensor). The step that writes one changed element through a record is defined here once:
//   * apply_element<E, T>(resident, value): the new storage word, E::apply (xor, ulp,
//     overwrite: dcr/codec/values.hpp) on a bit-preserving record, T::apply(value) (an element
//     cast, dcr/apply/transform.hpp) on a cast record, which only overwrite items reach;
//   * apply_record<E, T, W, D, Access>(p, canonical index, value): locate + read-modify-write of
//     one element, constexpr-free but DCR_HOST_DEVICE, what the CUDA apply kernel calls;
//   * detail::apply_records: the CPU loop over a sorted run of an item's records, prefetching a
//     fixed distance ahead (scattered writes are bound by cache misses); every CPU apply (compiled
//     placement, general-path sink, whole-checkpoint apply, benchmarks) runs through it.
// Storage words are reached through an access policy: `native_words` (aligned words in host
// order, the receiver's storage, also on a device) or `little_endian_words` (unaligned
// little-endian bytes of a safetensors file, host only).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "dcr/apply/transform.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/config.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// The exact inverse of one copy's src view: relative scratch offset -> dst element offset.
/// Trivially copyable, so a device kernel can take it by value (placement records hold one).
///
/// Dimensions with extent > 1 are kept, ordered by |src stride| descending. A dimension with a
/// negative src stride is walked backwards from the view's lowest address: quotient q stands for
/// coordinate extent-1-q, folded into `dst_origin` and a negated `dst_step`. The element with
/// quotients (q_0 .. q_{dims-1}) sits at relative src offset sum q_i * src_stride[i] and at dst
/// offset dst_origin + sum q_i * dst_step[i].
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
    inv.update_identity();
    return inv;
  }

  /// The inverse of a copy whose element with quotients (q_0 .. q_{d-1}) sits at relative src
  /// offset sum q_i * src_stride[i] and dst offset sum q_i * dst_step[i] (q_i < extent[i]);
  /// src strides positive, descending, non-overlapping; d <= max_rank. Extents of 1 are dropped.
  static view_inverse strided(std::span<const std::int64_t> src_stride,
                              std::span<const std::int64_t> extent,
                              std::span<const std::int64_t> dst_step) noexcept {
    view_inverse inv;
    for (std::size_t i = 0; i < src_stride.size() && inv.dims < max_rank; ++i) {
      if (extent[i] == 1) continue;
      const auto d = static_cast<std::size_t>(inv.dims++);
      inv.src_stride[d] = src_stride[i];
      inv.extent[d] = extent[i];
      inv.dst_step[d] = dst_step[i];
      inv.span += (extent[i] - 1) * src_stride[i];
    }
    inv.update_identity();
    return inv;
  }

  /// Recomputes `identity`: gapless (span + 1 == size) and dst steps equal src strides.
  constexpr void update_identity() noexcept {
    std::int64_t size = 1;
    bool same = dst_origin == 0;
    for (int i = 0; i < dims; ++i) {
      size *= extent[i];
      same = same && dst_step[i] == src_stride[i];
    }
    identity = same && span + 1 == size;
  }

  /// Number of elements.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < dims; ++i) n *= extent[i];
    return n;
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

  /// Calls f(rel, dst_off) for every element, quotients in row-major order (outermost dim =
  /// largest src stride first). Host-side enumeration for prewarm analysis and checks.
  template <class F>
  void for_each(F&& f) const {
    if (dims == 0) {
      f(std::int64_t{0}, dst_origin);
      return;
    }
    std::array<std::int64_t, max_rank> q{};
    std::int64_t rel = 0, off = dst_origin;
    const int inner = dims - 1;
    for (;;) {
      for (std::int64_t k = 0; k < extent[inner]; ++k)
        f(rel + k * src_stride[inner], off + k * dst_step[inner]);
      int d = inner - 1;
      for (; d >= 0; --d) {
        rel += src_stride[d];
        off += dst_step[d];
        if (++q[d] < extent[d]) break;
        rel -= q[d] * src_stride[d];
        off -= q[d] * dst_step[d];
        q[d] = 0;
      }
      if (d < 0) return;
    }
  }
};

static_assert(std::is_trivially_copyable_v<view_inverse>);

namespace detail {
__extension__ typedef unsigned __int128 uint128_t;  // GCC/Clang (and nvcc host code)
}  // namespace detail

/// Division by a divisor fixed at prewarm, as a multiply and a shift (Granlund and Montgomery:
/// with 2^(l-1) < d <= 2^l and m = ceil(2^(63+l) / d), floor(n / d) = floor(n * m / 2^(63+l))
/// for every n < 2^63). Replaces the hardware division of the per-element locate.
struct invariant_divisor {
  std::uint64_t multiplier = std::uint64_t{1} << 63;  ///< m (below 2^64)
  std::uint32_t shift = 63;                           ///< 63 + l

  /// The divisor `d` (1 <= d < 2^63).
  static invariant_divisor of(std::uint64_t d) noexcept {
    std::uint32_t l = 0;
    while (l < 63 && (std::uint64_t{1} << l) < d) ++l;
    invariant_divisor v;
    const detail::uint128_t top = static_cast<detail::uint128_t>(1) << (63 + l);
    v.multiplier = static_cast<std::uint64_t>((top + d - 1) / d);
    v.shift = 63 + l;
    return v;
  }

  /// floor(n / d) for n < 2^63.
  DCR_HOST_DEVICE std::uint64_t divide(std::uint64_t n) const noexcept {
#if DCR_DEVICE_COMPILE && defined(__CUDA_ARCH__)
    const std::uint64_t hi = __umul64hi(n, multiplier);
    return shift == 63 ? (hi << 1) | ((n * multiplier) >> 63) : hi >> (shift - 64);
#else
    return static_cast<std::uint64_t>((static_cast<detail::uint128_t>(n) * multiplier) >> shift);
#endif
  }
};

/// One compiled placement: a strided set of canonical elements of one tensor and where each
/// lands in storage. Canonical index i in [first, last] is an element of the record iff
/// locate(i - first, off) succeeds; it is stored at dst + off * dst_bytes, through
/// `transform`. Trivially copyable, so a device kernel can take an array of them.
struct placement {
  view_inverse inv;
  std::int64_t first = 0;          ///< canonical index of the lowest element
  std::int64_t last = 0;           ///< first + inv.span: the highest canonical index reached
  std::byte* dst = nullptr;        ///< storage address of dst offset 0
  element_transform transform{};   ///< applied to each canonical word
  std::uint8_t dst_bytes = 0;      ///< storage word width
  tensor_id tensor = 0;            ///< the canonical tensor
  std::uint32_t copies = 1;        ///< loader copies merged into this record
  std::array<invariant_divisor, max_rank> divisors{};  ///< by inv.src_stride[i] (finalize())

  /// The record of the elements `inv` describes, the lowest at canonical index `first`, stored
  /// from `dst` in words of `dst_bytes` through `transform`; with `finalized` (the default) the
  /// divisors are set, ready to apply (the prewarm probe finalizes after merging records).
  static placement of(const view_inverse& inv, std::int64_t first, std::byte* dst,
                      std::size_t dst_bytes, element_transform transform = {},
                      tensor_id tensor = 0, bool finalized = true) noexcept {
    placement p;
    p.inv = inv;
    p.first = first;
    p.last = first + inv.span;
    p.dst = dst;
    p.transform = transform;
    p.dst_bytes = static_cast<std::uint8_t>(dst_bytes);
    p.tensor = tensor;
    if (finalized) p.finalize();
    return p;
  }

  /// A record covering canonical elements [0, numel) stored contiguously from `dst` in words of
  /// `dst_bytes` (identity transform): a whole tensor of a checkpoint, or a flat array.
  static placement contiguous(std::byte* dst, std::int64_t numel, std::size_t dst_bytes,
                              tensor_id tensor = 0) noexcept {
    const std::int64_t one = 1;
    const std::int64_t extent = numel > 0 ? numel : 1;
    return of(view_inverse::strided(std::span(&one, 1), std::span(&extent, 1), std::span(&one, 1)),
              0, dst, dst_bytes, {}, tensor);
  }

  /// Sets the divisors from the inverse's strides; call after any change of `inv`.
  void finalize() noexcept {
    for (int i = 0; i < inv.dims; ++i)
      divisors[static_cast<std::size_t>(i)] =
          invariant_divisor::of(static_cast<std::uint64_t>(inv.src_stride[static_cast<std::size_t>(i)]));
  }

  /// view_inverse::locate with the divisions replaced by multiplications: if canonical index
  /// first + rel (rel in [0, last - first]) is an element of the record, stores its dst offset.
  DCR_HOST_DEVICE bool locate(std::int64_t rel, std::int64_t& dst_off) const noexcept {
    if (inv.identity) {
      dst_off = rel;
      return true;
    }
    auto r = static_cast<std::uint64_t>(rel);
    std::int64_t off = inv.dst_origin;
    for (int i = 0; i < inv.dims; ++i) {
      const std::uint64_t q = divisors[static_cast<std::size_t>(i)].divide(r);
      if (q >= static_cast<std::uint64_t>(inv.extent[static_cast<std::size_t>(i)])) return false;
      r -= q * static_cast<std::uint64_t>(inv.src_stride[static_cast<std::size_t>(i)]);
      off += static_cast<std::int64_t>(q) * inv.dst_step[static_cast<std::size_t>(i)];
    }
    if (r != 0) return false;
    dst_off = off;
    return true;
  }

  /// Storage address of the element at dst offset `off`.
  [[nodiscard]] DCR_HOST_DEVICE std::byte* address(std::int64_t off) const noexcept {
    return dst + off * static_cast<std::int64_t>(dst_bytes);
  }
};

static_assert(std::is_trivially_copyable_v<placement>);

// ---- The per-record step ----------------------------------------------------------------------

/// Whether the step can take encoding E through transform T from canonical words W into storage
/// words D: the identity keeps the width and takes every encoding; a cast reads the tensor's
/// words, writes its own destination words and takes only overwrite values.
template <class E, class T, class W, class D>
inline constexpr bool step_supported_v = [] {
  if constexpr (T::kind == cast_kind::identity)
    return std::is_same_v<W, D>;
  else
    return E::id == encoding::overwrite && cast_maps_v<T, W, D>;
}();

/// The storage word an element gets: E::apply(resident, value) through the identity, the cast of
/// the new bits otherwise. Integer operations on stored words only.
template <class E, class T, storage_word W, storage_word D>
  requires step_supported_v<E, T, W, D>
DCR_HOST_DEVICE constexpr D apply_element(D resident, W value) noexcept {
  if constexpr (T::kind == cast_kind::identity)
    return E::apply(resident, value);
  else
    return static_cast<D>(T::apply(value));
}

/// Storage of aligned words in host byte order (receiver storage; device memory too).
struct native_words {
  template <storage_word D>
  DCR_HOST_DEVICE static D load(const std::byte* p) noexcept {
    return *reinterpret_cast<const D*>(p);
  }
  template <storage_word D>
  DCR_HOST_DEVICE static void store(std::byte* p, D v) noexcept {
    *reinterpret_cast<D*>(p) = v;
  }
};

/// Storage of little-endian words at any alignment (a mapped safetensors file). Host only.
struct little_endian_words {
  template <storage_word D>
  static D load(const std::byte* p) noexcept {
    return detail::load_le<D>(p);
  }
  template <storage_word D>
  static void store(std::byte* p, D v) noexcept {
    detail::store_le<D>(p, v);
  }
};

/// Observer of the writes of an apply loop that wants none (the default). An observer is
/// called as observe(record, k, address, word before) after each write of item record k.
struct no_write_observer {
  template <class D>
  DCR_HOST_DEVICE void operator()(const placement&, std::size_t, std::byte*, D) const noexcept {}
};

/// Applies one changed element: canonical index `canonical` with item value `value` through
/// record `p`. Returns false (writing nothing) when the index is not an element of the record
/// (outside [p.first, p.last], or in a gap of its strides). The caller guarantees that the
/// combination is one the record admits (step_supported_v, and xor/ulp only on records of
/// tensors that are not overwrite-only: the plan's checks) and that `p.dst` stays valid.
template <class E, class T, storage_word W, storage_word D, class Access = native_words>
DCR_HOST_DEVICE bool apply_record(const placement& p, std::uint64_t canonical, W value) noexcept {
  const auto rel = static_cast<std::int64_t>(canonical) - p.first;
  if (rel < 0 || rel > p.last - p.first) return false;
  std::int64_t off = 0;
  if (!p.locate(rel, off)) return false;
  std::byte* const at = p.address(off);
  Access::template store<D>(at, apply_element<E, T, W, D>(Access::template load<D>(at), value));
  return true;
}

/// apply_record with the record's transform chosen at run time (on the device too, where
/// records live in device memory): identity into W words, a cast of W words into its
/// destination words. Returns false, writing nothing, for a transform the step cannot take
/// with E (xor/ulp through a cast: the plan refuses those items before any apply) and for an
/// index that is not an element of the record.
template <class E, storage_word W, class Access = native_words>
DCR_HOST_DEVICE bool apply_record_any(const placement& p, std::uint64_t canonical,
                                      W value) noexcept {
  const auto through = [&](auto c) -> bool {
    using T = std::remove_cvref_t<decltype(c)>;
    if constexpr (T::kind == cast_kind::identity) {
      return apply_record<E, T, W, W, Access>(p, canonical, value);
    } else if constexpr (step_supported_v<E, T, W, typename T::to_word>) {
      return apply_record<E, T, W, typename T::to_word, Access>(p, canonical, value);
    } else {
      return false;
    }
  };
  return dispatch_cast(p.transform.kind, through, [] { return false; });
}

/// Calls f(E{}, T{}, D{}) with the policy types of encoding `enc` and transform `t` and the
/// storage word D they write, for canonical words W. Throws errc::unsupported_version for an
/// unknown encoding, errc::invalid_argument for an unknown cast, errc::unsupported_loader_path
/// for a combination the step does not take (xor/ulp through a cast, a cast of other words).
template <storage_word W, class F>
decltype(auto) visit_step(encoding enc, element_transform t, F&& f) {
  using R = decltype(f(overwrite_encoding{}, identity_cast{}, W{}));
  return visit_encoding(enc, [&](auto e) -> R {
    using E = std::remove_cvref_t<decltype(e)>;
    return visit_cast(t.kind, [&](auto c) -> R {
      using T = std::remove_cvref_t<decltype(c)>;
      if constexpr (T::kind == cast_kind::identity) {
        return f(e, c, W{});
      } else if constexpr (step_supported_v<E, T, W, typename T::to_word>) {
        return f(e, c, typename T::to_word{});
      } else {
        throw error(errc::unsupported_loader_path,
                    "dcr apply: " + transform_name(t) + " cannot take encoding " +
                        std::to_string(static_cast<int>(enc)) + " on " +
                        std::to_string(sizeof(W)) + "-byte words (overwrite only)");
      }
    });
  });
}

namespace detail {

/// Asks for the cache line at `p` ahead of a write to it. Inline in every mode: it is one
/// instruction in the apply loop's per-record step, and a call to a separately compiled body
/// would cost more than the hint.
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 1);
#else
  (void)p;
#endif
}

/// The CPU loop of the step: applies records [k_begin, k_end) of one item (sorted canonical
/// indices `active`, values `values`) through record `p`, skipping indices that are not
/// elements of `p`. Calls observe(p, k, address, word before) after each write. Returns the
/// writes. Writes go in index order (replicas and repeats keep the dense load's order); a
/// record that is not the identity locates and prefetches `ahead` records before it writes.
template <class E, class T, storage_word W, storage_word D, class Access = native_words,
          class Observer = no_write_observer>
  requires step_supported_v<E, T, W, D>
std::uint64_t apply_records(const placement& p, const std::uint64_t* active, const W* values,
                            std::size_t k_begin, std::size_t k_end, Observer&& observe = {}) {
  if (p.inv.identity) {
    // Storage offset == canonical offset: one read-modify-write per record, in index order (the
    // out-of-order core overlaps the misses of independent iterations).
    for (std::size_t k = k_begin; k < k_end; ++k) {
      std::byte* const at = p.address(static_cast<std::int64_t>(active[k]) - p.first);
      const D before = Access::template load<D>(at);
      Access::template store<D>(at, apply_element<E, T, W, D>(before, values[k]));
      observe(p, k, at, before);
    }
    return k_end - k_begin;
  }
  // A ring of `ahead` located writes: record k's line is prefetched when it is located and
  // read-modified-written `ahead` located records later, so about `ahead` misses stay in flight
  // at every step (a batch that locates 32 and then writes 32 starts each batch with its first
  // line barely requested; measured in docs/benchmarks.md, "Apply against a memcpy").
  constexpr std::size_t ahead = 32;  // a power of two
  std::byte* at[ahead];
  std::size_t ks[ahead];
  std::size_t located = 0, written = 0;
  const auto write = [&](std::size_t slot) {
    const D before = Access::template load<D>(at[slot]);
    Access::template store<D>(at[slot], apply_element<E, T, W, D>(before, values[ks[slot]]));
    observe(p, ks[slot], at[slot], before);
  };
  for (std::size_t k = k_begin; k < k_end; ++k) {
    std::int64_t off = 0;
    if (!p.locate(static_cast<std::int64_t>(active[k]) - p.first, off)) continue;
    if (located - written == ahead) write(written++ % ahead);
    const std::size_t slot = located++ % ahead;
    at[slot] = p.address(off);
    ks[slot] = k;
    prefetch_for_write(at[slot]);
  }
  while (written != located) write(written++ % ahead);
  return located;
}

}  // namespace detail

/// Applies the sorted records of one item (canonical indices `active`, one value each, encoding
/// `enc`) through `records` (a tensor's compiled placement, or any records of one tensor): for
/// each record, the item's records inside its canonical window [first, last] (binary search)
/// go through the step; an index in a gap of a record's strides is not written by it. A
/// canonical element placed by several records (replicas) is written by each. Returns the
/// writes; calls observe(record, k, address, word before) after each. Throws (before writing
/// through the record) what visit_step throws for a record that cannot take `enc`; callers
/// check encodings against the plan first, so that no item is partly applied.
template <storage_word W, class Access = native_words, class Observer = no_write_observer>
std::uint64_t apply_item_records(std::span<const placement> records, encoding enc,
                                 std::span<const std::uint64_t> active, const W* values,
                                 Observer&& observe = {}) {
  const std::uint64_t* const a = active.data();
  const std::size_t n = active.size();
  std::uint64_t writes = 0;
  for (const placement& p : records) {
    const auto lo = std::lower_bound(a, a + n, static_cast<std::uint64_t>(p.first));
    const auto hi = std::upper_bound(lo, a + n, static_cast<std::uint64_t>(p.last));
    if (lo == hi) continue;
    const auto k0 = static_cast<std::size_t>(lo - a);
    const auto k1 = static_cast<std::size_t>(hi - a);
    writes += visit_step<W>(enc, p.transform, [&](auto e, auto c, auto d) {
      using E = std::remove_cvref_t<decltype(e)>;
      using T = std::remove_cvref_t<decltype(c)>;
      using D = std::remove_cvref_t<decltype(d)>;
      return detail::apply_records<E, T, W, D, Access>(p, a, values, k0, k1, observe);
    });
  }
  return writes;
}

}  // namespace dcr
