// dcr/detail/apply/apply.inl: the bodies of dcr/apply/apply.hpp (included at its end). All of
// item_applier_base is loader-independent, so in separate compilation (DCR_HEADER_BODIES,
// dcr/config.hpp) it is compiled once; item_applier<Loader> stays in the header.
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

namespace dcr {

namespace detail {

DCR_INLINE void aligned_scratch::reset(std::size_t bytes) {
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  data_.reset(static_cast<std::byte*>(::operator new(rounded, std::align_val_t{64})));
  // Zeroing also touches every page now, at prewarm, not during the first apply.
  std::memset(data_.get(), 0, rounded);
  bytes_ = rounded;
}

DCR_INLINE bool increasing_below_2_63(const std::uint64_t* p, std::size_t n) noexcept {
  if (n == 0) return true;
  // With every value below 2^63, p[i] - p[i - 1] - 1 has its top bit set iff p[i] <= p[i - 1];
  // OR-ing the values in as well makes a clear top bit prove both. No branch per index, so the
  // loop vectorizes: apply() checks every index of every item before the first write.
  std::uint64_t acc = p[0];
  for (std::size_t i = 1; i < n; ++i) acc |= p[i] | (p[i] - p[i - 1] - 1);
  return (acc >> 63) == 0;
}

DCR_INLINE std::string to_hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[v & 0xf]);
    v >>= 4;
  } while (v != 0);
  return out;
}

DCR_INLINE std::uint64_t verify_writes(std::span<const write_record> log) {
  for (const write_record& w : log) {
    const std::uint64_t stored = load_word_bytes(w.dst, w.dst_bytes);
    std::uint64_t expected = 0;
    visit_word(w.src_bytes, [&](auto sw) {
      using W = decltype(sw);
      const auto value = static_cast<W>(w.value);
      if (w.enc == encoding::overwrite) {
        visit_word(w.dst_bytes, [&](auto dw) {
          using D = decltype(dw);
          expected = transform_word<D>(w.transform, value);
        });
      } else {
        visit_encoding(w.enc, [&](auto e) {
          expected = decltype(e)::apply(static_cast<W>(w.before), value);
        });
      }
    });
    DCR_EXPECTS(stored == expected, errc::verification_failed,
                "dcr apply: post-apply check failed for tensor '" + std::string(w.tensor) +
                    "' element " + std::to_string(w.index) + ": storage holds 0x" +
                    to_hex(stored) + ", the record prescribes 0x" + to_hex(expected) +
                    (w.enc == encoding::overwrite
                         ? std::string(" (") + transform_name(w.transform) + " of the new bits)"
                         : " (pre-copy bits 0x" + to_hex(w.before) + ")") +
                    "; another write overlapped, or storage changed during the apply");
  }
  return log.size();
}

}  // namespace detail

DCR_INLINE item_applier_base::~item_applier_base() = default;

DCR_INLINE void item_applier_base::set_backend(apply_backend* backend) {
  if (backend != nullptr && prewarmed_) backend->prepare(plan_);  // may throw: keep the old one
  backend_ = backend;
}

DCR_INLINE std::string item_applier_base::apply_device() const {
  return backend_ != nullptr ? backend_->device() : std::string("cpu");
}

DCR_INLINE bool item_applier_base::skips(tensor_id id) const {
  DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::skips: call prewarm() first");
  DCR_EXPECTS(id < registry_->size(), errc::unknown_tensor,
              "item_applier::skips: no tensor with id " + std::to_string(id));
  return plan_.skips(id);
}

DCR_INLINE std::span<const tensor_id> item_applier_base::overwrite_only_tensors() const {
  DCR_EXPECTS(prewarmed_, errc::not_ready,
              "item_applier::overwrite_only_tensors: call prewarm() first");
  return plan_.overwrite_only_tensors();
}

DCR_INLINE const placement_plan& item_applier_base::plan() const {
  DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::plan: call prewarm() first");
  return plan_;
}

DCR_INLINE apply_stats item_applier_base::apply(std::span<const item> items,
                                                const apply_options& options) {
  DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::apply: call prewarm() first");
  DCR_EXPECTS(backend_ == nullptr || (options.path == apply_path::compiled && !options.verify),
              errc::invalid_argument,
              "item_applier::apply: the " + backend_->device() +
                  " apply backend runs the compiled path only, without post-apply checks "
                  "(the general path and the checks work on the host storage)");
  for (std::size_t k = 0; k < items.size(); ++k) validate(items[k], k);
  std::vector<write_record>* log = options.verify ? &log_ : nullptr;
  log_.clear();
  apply_stats stats = options.path == apply_path::general ? apply_general(items, log)
                                                          : apply_compiled(items, log);
  if (log != nullptr) stats.verified = detail::verify_writes(log_);
  return stats;
}

DCR_INLINE std::span<std::byte> item_applier_base::begin_prewarm() {
  prewarmed_ = false;
  scratch_.reset(static_cast<std::size_t>(std::max<std::int64_t>(registry_->max_tensor_bytes(), 8)));
  return {scratch_.data(), scratch_.bytes()};
}

DCR_INLINE void item_applier_base::end_prewarm(placement_plan plan) {
  plan_ = std::move(plan);
  if (backend_ != nullptr) backend_->prepare(plan_);
  prewarmed_ = true;
}

DCR_INLINE const canonical_tensor& item_applier_base::check_dense_view(
    tensor_id id, std::size_t word_bytes, int rank, const std::int64_t* extents) const {
  const canonical_tensor& t = registry_->at(id);
  DCR_EXPECTS(dtype_size(t.type) == word_bytes, errc::dtype_mismatch,
              "item_applier::dense_load: tensor '" + t.name + "' is " +
                  std::string(dtype_name(t.type)) + ", not " + std::to_string(word_bytes) +
                  "-byte words");
  bool same = rank == static_cast<int>(t.shape.size());
  for (int d = 0; same && d < rank; ++d) same = extents[d] == t.shape[static_cast<std::size_t>(d)];
  DCR_EXPECTS(same, errc::shape_mismatch,
              "item_applier::dense_load: view shape differs from tensor '" + t.name + "'");
  return t;
}

// Cheap checks apply relies on for memory safety and exactness; the decoder has already made
// them, but a hand-built item must not corrupt storage either.
DCR_INLINE const canonical_tensor& item_applier_base::validate(const item& it, std::size_t k) const {
  const canonical_tensor& t = registry_->at(it.tensor);
  // Messages are built only on failure (DCR_EXPECTS evaluates them lazily).
  const auto where = [&] {
    return "item_applier::apply: item " + std::to_string(k) + " (tensor '" + t.name + "'): ";
  };
  DCR_EXPECTS(it.type == t.type, errc::dtype_mismatch,
              where() + "dtype " + std::string(dtype_name(it.type)) + " but the tensor is " +
                  std::string(dtype_name(t.type)));
  DCR_EXPECTS(it.values.size() == it.count() * it.word_bytes(), errc::invalid_argument,
              where() + "value bytes do not match the record count");
  DCR_EXPECTS(is_supported_encoding(it.enc), errc::unsupported_version,
              where() + "encoding " + std::to_string(static_cast<int>(it.enc)) +
                  " is not supported by the apply path");
  const bool needs_bits =
      visit_encoding(it.enc, [](auto e) { return decltype(e)::needs_committed_bits; });
  DCR_EXPECTS(!needs_bits || !plan_.overwrite_only(it.tensor), errc::unsupported_loader_path,
              where() + "encoding " + std::to_string(static_cast<int>(it.enc)) +
                  " needs a bit-preserving path, but this receiver takes the tensor as "
                  "overwrite only (" + plan_.at(it.tensor).reason + ")");
  const auto numel = static_cast<std::uint64_t>(t.numel());
  const auto& idx = it.indices;
  if (!detail::increasing_below_2_63(idx.data(), idx.size())) {
    for (std::size_t i = 1; i < idx.size(); ++i) {
      DCR_EXPECTS(idx[i - 1] < idx[i], errc::invalid_argument,
                  where() + "indices not strictly increasing at record " + std::to_string(i));
    }
  }
  DCR_EXPECTS(idx.empty() || idx.back() < numel, errc::out_of_range,
              where() + "index " + std::to_string(idx.back()) + " outside the tensor's " +
                  std::to_string(numel) + " elements");
  return t;
}

// ---- compiled path

DCR_INLINE apply_stats item_applier_base::apply_compiled(std::span<const item> items,
                                                         std::vector<write_record>* log) {
  apply_stats stats;
  for (const item& it : items) {
    ++stats.items;
    stats.records += it.count();
    if (it.count() == 0) continue;
    if (plan_.skips(it.tensor)) {
      ++stats.skipped_items;
      continue;
    }
    stats.writes += backend_ != nullptr ? backend_->apply(it) : apply_item_compiled(it, log);
  }
  return stats;
}

DCR_INLINE std::uint64_t item_applier_base::apply_item_compiled(const item& it,
                                                                std::vector<write_record>* log) {
  const auto records = plan_.placements_of(it.tensor);
  const std::string_view name = plan_.at(it.tensor).name;
  return visit_word(it.word_bytes(), [&](auto w) -> std::uint64_t {
    using W = decltype(w);
    const W* const values = it.template words<W>().data();
    if (log == nullptr) return apply_item_records<W>(records, it.enc, it.indices, values);
    return apply_item_records<W>(
        records, it.enc, it.indices, values,
        [&](const placement& p, std::size_t k, std::byte* at, auto before) {
          log->push_back(write_record{at, before, values[k], it.indices[k], name, it.enc,
                                      p.transform, sizeof(W), sizeof(before)});
        });
  });
}

// ---- general path

DCR_INLINE apply_stats item_applier_base::apply_general(std::span<const item> items,
                                                        std::vector<write_record>* log) {
  check_writes_.assign(items.size(), 0);
  for (std::size_t k = 0; k < items.size(); ++k) {
    const item& it = items[k];
    if (it.count() == 0 || plan_.skips(it.tensor)) continue;
    check_writes_[k] = run_loader(it, registry_->at(it.tensor), delta_pass::check, nullptr).elements;
  }
  apply_stats stats;
  for (std::size_t k = 0; k < items.size(); ++k) {
    const item& it = items[k];
    ++stats.items;
    stats.records += it.count();
    if (it.count() == 0) continue;
    if (plan_.skips(it.tensor)) {
      ++stats.skipped_items;
      continue;
    }
    const canonical_tensor& t = registry_->at(it.tensor);
    const load_record r = run_loader(it, t, delta_pass::write, log);
    DCR_EXPECTS(r.elements == check_writes_[k], errc::unsupported_loader_path,
                "item_applier::apply: loader placed tensor '" + t.name +
                    "' differently on the write pass than on the check pass (loaders must be "
                    "deterministic); storage may be partially updated, retry with overwrite");
    stats.writes += r.elements;
  }
  return stats;
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
