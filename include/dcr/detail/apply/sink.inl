// dcr/detail/apply/sink.inl: the bodies of dcr/apply/sink.hpp's copies through a transform
// (included at its end). In separate compilation (dcr/config.hpp) they are instantiated once,
// for every pair of storage words, in the unit with dcr/separate_compilation.hpp: a loader's
// unit then compiles only its own load() calls, not the sinks' apply loops.
#pragma once

namespace dcr {

template <storage_word W>
template <storage_word D>
void dense_sink<W>::copy(tensor_view<D> dst, tensor_view<const W> src,
                         element_transform transform) {
  detail::check_copy_after_skip(current_);
  detail::check_copy_shapes(current_, dst, src);
  if (transform.preserves_bits() && std::is_same_v<D, W>) {
    if constexpr (std::is_same_v<D, W>) copy(dst, src);
    return;
  }
  check_transform<W, D>(transform, type_, detail::copy_where(current_));
  visit_cast(transform.kind, [&](auto c) {
    using T = decltype(c);
    if constexpr (cast_maps_v<T, W, D>) detail::copy_transformed<T>(dst, src);
  });
  ++current_.copies;
  current_.elements += static_cast<std::uint64_t>(dst.size());
}

template <storage_word W>
template <storage_word D>
void delta_sink<W>::copy(tensor_view<D> dst, tensor_view<const W> src,
                         element_transform transform) {
  detail::check_copy_after_skip(current_);
  detail::check_copy_shapes(current_, dst, src);
  check_transform<W, D>(transform, type_, detail::copy_where(current_));
  // An empty copy (a rank whose share of the tensor is empty) places no element: nothing to
  // locate, nothing outside the tensor, and no bits to preserve, so its transform does not
  // make the tensor overwrite-only (as in compile_placement, which records no placement for
  // it; both paths must accept and refuse the same items).
  if (src.size() == 0) {
    ++current_.copies;
    return;
  }
  DCR_EXPECTS(transform.preserves_bits() || !needs_bits_, errc::unsupported_loader_path,
              detail::copy_where(current_) + " applies " + transform_name(transform) +
                  ", which does not preserve bits: the tensor takes overwrite records only, "
                  "not " +
                  encoding_name());
  const auto c = detail::locate_copy(current_, base_, numel_, dst, src);
  ++current_.copies;
  const auto lo =
      std::lower_bound(active_.begin(), active_.end(), static_cast<std::uint64_t>(c.first));
  const auto hi =
      std::upper_bound(lo, active_.end(), static_cast<std::uint64_t>(c.first + c.inv.span));
  const std::size_t k_begin = static_cast<std::size_t>(lo - active_.begin());
  const std::size_t k_end = static_cast<std::size_t>(hi - active_.begin());
  auto* const out = reinterpret_cast<std::byte*>(dst.data());
  if (pass_ == delta_pass::check) {
    check_range(out, sizeof(D), detail::is_non_overlapping(dst), c.inv, c.first, k_begin, k_end);
    return;
  }
  const placement rec = detail::record_of_copy(c, out, transform, sizeof(D), 0, /*finalized=*/true);
  visit_step<W>(enc_, transform, [&](auto e, auto cast, auto d) {
    using E = decltype(e);
    using T = decltype(cast);
    if constexpr (std::is_same_v<decltype(d), D>) {
      if (log_ == nullptr) {
        current_.elements +=
            detail::apply_records<E, T, W, D>(rec, active_.data(), values_.data(), k_begin, k_end);
        return;
      }
      current_.elements += detail::apply_records<E, T, W, D>(
          rec, active_.data(), values_.data(), k_begin, k_end,
          [&](const placement&, std::size_t k, std::byte* at, D before) {
            log_->push_back(write_record{at, before, values_[k], active_[k], current_.tensor, enc_,
                                         transform, sizeof(W), sizeof(D)});
          });
    }
  });
}

#if defined(DCR_SEPARATE_COMPILATION)
#define DCR_SINK_COPIES(W, D)                                                                  \
  DCR_EXPLICIT_INSTANTIATION void dense_sink<W>::copy<D>(tensor_view<D>, tensor_view<const W>, \
                                                         element_transform);                   \
  DCR_EXPLICIT_INSTANTIATION void delta_sink<W>::copy<D>(tensor_view<D>, tensor_view<const W>, \
                                                         element_transform);
DCR_FOR_EACH_WORD_PAIR(DCR_SINK_COPIES)
#undef DCR_SINK_COPIES
#endif

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

namespace detail {

DCR_INLINE std::uint64_t load_word_bytes(const std::byte* p, std::size_t bytes) noexcept {
  return visit_word(bytes,
                    [&](auto w) { return static_cast<std::uint64_t>(load_word<decltype(w)>(p)); });
}

DCR_INLINE void check_copy_or_skip(const load_record& r) {
  DCR_EXPECTS(r.copies > 0 || r.skipped, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) +
                  "' neither copied nor skipped it (every tensor needs copies or an explicit "
                  "sink.skip(t))");
}

DCR_INLINE void check_copy_after_skip(const load_record& r) {
  DCR_EXPECTS(
      !r.skipped, errc::unsupported_loader_path,
      "dcr loader: load() of tensor '" + std::string(r.tensor) + "' both copied and skipped it");
}

DCR_INLINE void check_skip_target(const load_record& r, const canonical_tensor& t) {
  DCR_EXPECTS(t.name == r.tensor, errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + std::string(r.tensor) + "' skipped tensor '" +
                  t.name + "' instead");
  DCR_EXPECTS(
      r.copies == 0, errc::unsupported_loader_path,
      "dcr loader: load() of tensor '" + std::string(r.tensor) + "' both copied and skipped it");
}

DCR_INLINE std::string copy_where(const load_record& r) {
  return "dcr loader: copy #" + std::to_string(r.copies + 1) + " of tensor '" +
         std::string(r.tensor) + "'";
}

DCR_INLINE placement record_of_copy(const located_copy& c, std::byte* dst,
                                    element_transform transform, std::size_t dst_bytes,
                                    tensor_id tensor, bool finalized) noexcept {
  return placement::of(c.inv, c.first, dst, dst_bytes, transform, tensor, finalized);
}

}  // namespace detail

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
