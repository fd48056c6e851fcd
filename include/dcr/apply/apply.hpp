// dcr/apply/apply.hpp: the receiver's in-place apply, on the compiled or the general path, and
// the dense load through the same loader.
//
// `item_applier` owns the receiver's scratch. prewarm() compiles the loader's placement once
// (dcr/apply/placement.hpp): which tensors this rank skips, where every canonical element lands,
// which tensors are overwrite-only. apply() then writes each item's changed elements exactly
// where the engine's own dense load would put them, on one of two paths:
//   * compiled (default): from the placement records, without calling the loader:
//     O(log records + changed-in-window * rank) per record, no allocation;
//   * general (the paper's): the loader runs once per item with a `delta_sink` that intercepts
//     each final storage copy and updates only the item's elements (dcr/apply/sink.hpp).
// Both paths give identical bits, equal to a dense refit through the same loader (dense_load
// runs it with a `dense_sink`).
//
// No partial write: validation of payload framing, versions and indices is the decoder's job and
// happens before apply. apply() re-checks each item (tensor, dtype, value count, sorted in-range
// indices, encoding) and refuses an xor/ulp item for an overwrite-only tensor, for every item of
// the call before the first write. The compiled path needs nothing else: the loader conditions
// were checked at prewarm. The general path runs in two passes over the whole span of items:
//   1. check pass: the loader runs for every item with a sink that validates each copy and
//      counts the writes it would make, touching no storage;
//   2. write pass: only if every item passed, the loader runs again and the sink writes.
// Pass 2 can only fail if the loader is not deterministic (a loader condition): the write counts
// of both passes are compared and a mismatch is reported as errc::unsupported_loader_path;
// storage may then hold a partial transition, which the protocol repairs with an overwrite-only
// retry.
//
// Optional post-apply checks (apply_options::verify): every written element's pre-copy bits are
// kept, and after all writes each element must hold exactly what its record prescribes:
// transform(value) for an overwrite, E::apply(pre-copy bits, value) for xor/ulp (for xor: the
// mask re-applied to the stored bits restores the pre-copy bits). A failure is
// errc::verification_failed naming the tensor and canonical element; storage has then been
// written, and the attempt must fail (its overwrite retry repairs it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "dcr/apply/apply_backend.hpp"
#include "dcr/apply/loader.hpp"
#include "dcr/apply/placement.hpp"
#include "dcr/apply/sink.hpp"
#include "dcr/apply/transform.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// How one apply() runs.
struct apply_options {
  apply_path path = apply_path::compiled;  ///< compiled (default) or general
  bool verify = false;                     ///< post-apply checks of every write
};

/// Counters of one apply() call.
struct apply_stats {
  std::uint64_t items = 0;          ///< items in the call
  std::uint64_t records = 0;        ///< records (active canonical elements) in them
  std::uint64_t writes = 0;         ///< destination elements written (replicas count each)
  std::uint64_t skipped_items = 0;  ///< items with records whose tensor this rank does not hold
  std::uint64_t verified = 0;       ///< writes checked after the apply (apply_options::verify)
};

namespace detail {
/// A zero-initialized, 64-byte aligned block of raw storage. Raw operator new storage
/// implicitly creates the word objects the loader's scratch view reads.
class aligned_scratch {
 public:
  void reset(std::size_t bytes) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    data_.reset(static_cast<std::byte*>(::operator new(rounded, std::align_val_t{64})));
    // Zeroing also touches every page now, at prewarm, not during the first apply.
    std::memset(data_.get(), 0, rounded);
    bytes_ = rounded;
  }
  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, deleter> data_;
  std::size_t bytes_ = 0;
};

inline std::string to_hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[v & 0xf]);
    v >>= 4;
  } while (v != 0);
  return out;
}

/// Checks every write of an apply against its record (see the file comment). Throws
/// errc::verification_failed naming the tensor and canonical element of the first mismatch.
inline std::uint64_t verify_writes(std::span<const write_record> log) {
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

/// Applies decoded items in place through an engine's loader, and dense-loads tensors through
/// the same loader.
///
/// Preconditions of apply(): items were validated by the decoder against `registry` (the
/// applier re-checks the cheap ones: tensor id, dtype, value count, sorted in-range indices,
/// encoding), deduplicated by payload id (dcr::payload_ledger), and, for xor/ulp items, storage
/// holds the committed bits those values were made from. The registry, loader and engine
/// storage must outlive the applier; the loader must not change its placement (nor the engine
/// move its storage) between prewarm() and the commit of the transition (call prewarm() again if
/// it does). Not thread-safe: an applier owns one scratch, one plan and one set of sinks, so each
/// apply thread of a receiver needs its own.
template <class Loader>
  requires loader<Loader>
class item_applier {
 public:
  item_applier(const tensor_registry& registry, Loader& loader, apply_options options = {})
      : registry_(&registry), loader_(&loader), options_(options) {}

  /// Allocates and zeroes the scratch (the largest canonical tensor), then compiles the
  /// loader's placement (dcr::compile_placement): probes every tensor, records where its
  /// elements land and which tensors this rank skips, and decides which tensors are
  /// overwrite-only. Throws errc::unsupported_loader_path (naming the tensor) for a loader that
  /// breaks a loader condition, so such a loader fails here, before any transition.
  void prewarm() {
    prewarmed_ = false;
    scratch_.reset(static_cast<std::size_t>(std::max<std::int64_t>(registry_->max_tensor_bytes(), 8)));
    plan_ = compile_placement(*registry_, *loader_, scratch_.data(), scratch_.bytes());
    if (backend_ != nullptr) backend_->prepare(plan_);
    prewarmed_ = true;
  }

  /// Runs the compiled path's writes through `backend` from now on (dcr/apply/apply_backend.hpp;
  /// e.g. into a GPU's copy of the storage); nullptr returns to the CPU loop (the default).
  /// Validation stays here, before any write. With a backend, apply() refuses the general path
  /// and post-apply checks (errc::invalid_argument, nothing written): both work on the host
  /// storage. On a prewarmed applier the backend is prepared with the plan at once. The backend
  /// must outlive its use.
  void set_backend(apply_backend* backend) {
    if (backend != nullptr && prewarmed_) backend->prepare(plan_);  // may throw: keep the old one
    backend_ = backend;
  }

  /// Where the compiled path writes: "cpu" or the backend's device().
  [[nodiscard]] std::string apply_device() const {
    return backend_ != nullptr ? backend_->device() : std::string("cpu");
  }

  /// Whether prewarm() completed.
  [[nodiscard]] bool prewarmed() const noexcept { return prewarmed_; }

  /// The options apply(items) uses.
  [[nodiscard]] const apply_options& options() const noexcept { return options_; }
  void set_options(const apply_options& options) noexcept { options_ = options; }

  /// Whether the loader skips tensor `id` on this rank (as probed by prewarm()).
  [[nodiscard]] bool skips(tensor_id id) const {
    DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::skips: call prewarm() first");
    DCR_EXPECTS(id < registry_->size(), errc::unknown_tensor,
                "item_applier::skips: no tensor with id " + std::to_string(id));
    return plan_.skips(id);
  }

  /// Canonical tensors this rank takes only as overwrite records, ascending (after prewarm()).
  [[nodiscard]] std::span<const tensor_id> overwrite_only_tensors() const {
    DCR_EXPECTS(prewarmed_, errc::not_ready,
                "item_applier::overwrite_only_tensors: call prewarm() first");
    return plan_.overwrite_only_tensors();
  }

  /// The compiled placement: records and the per-tensor report (after prewarm()).
  [[nodiscard]] const placement_plan& plan() const {
    DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::plan: call prewarm() first");
    return plan_;
  }

  /// Applies `items` (typically one payload) in place with options(). See the overload.
  apply_stats apply(std::span<const item> items) { return apply(items, options_); }

  /// Applies `items` in place on `options.path`, then, with `options.verify`, checks every
  /// write. Items of tensors this rank skips count in skipped_items and cost nothing; items
  /// without records write nothing. Throws errc::not_ready before prewarm(); unknown_tensor,
  /// dtype_mismatch, invalid_argument, out_of_range or unsupported_version for a malformed item,
  /// unsupported_loader_path for an xor/ulp item of an overwrite-only tensor (and, on the
  /// general path, a loader path the item cannot take): all before the first write.
  /// verification_failed after the writes when a post-apply check fails.
  apply_stats apply(std::span<const item> items, const apply_options& options) {
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

  /// Dense load of canonical tensor `id` from `canonical_words` (any view with the canonical
  /// shape) through the loader: copies every element the loader places on this rank. This is
  /// the dense refit, and the restore a joining receiver performs. Needs no prewarm(). Throws
  /// dtype_mismatch when W is not the tensor's word width, shape_mismatch when the view's
  /// extents differ from the canonical shape, unsupported_loader_path when the loader neither
  /// copies nor skips the tensor. Returns what the loader did (copies, elements, skipped).
  template <storage_word W>
  load_record dense_load(tensor_id id, tensor_view<const W> canonical_words) {
    const canonical_tensor& t = registry_->at(id);
    DCR_EXPECTS(dtype_size(t.type) == sizeof(W), errc::dtype_mismatch,
                "item_applier::dense_load: tensor '" + t.name + "' is " +
                    std::string(dtype_name(t.type)) + ", not " + std::to_string(sizeof(W)) +
                    "-byte words");
    bool same = canonical_words.rank() == static_cast<int>(t.shape.size());
    for (int d = 0; same && d < canonical_words.rank(); ++d)
      same = canonical_words.extent(d) == t.shape[static_cast<std::size_t>(d)];
    DCR_EXPECTS(same, errc::shape_mismatch,
                "item_applier::dense_load: view shape differs from tensor '" + t.name + "'");
    auto& sink = std::get<dense_sink<W>>(dense_sinks_);
    sink.clear_log();
    sink.begin(t);
    loader_->load(t, canonical_words, sink);
    return sink.finish();
  }

 private:
  /// Cheap checks apply relies on for memory safety and exactness; the decoder has already
  /// made them, but a hand-built item must not corrupt storage either.
  const canonical_tensor& validate(const item& it, std::size_t k) const {
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
    for (std::size_t i = 1; i < idx.size(); ++i) {
      DCR_EXPECTS(idx[i - 1] < idx[i], errc::invalid_argument,
                  where() + "indices not strictly increasing at record " + std::to_string(i));
    }
    DCR_EXPECTS(idx.empty() || idx.back() < numel, errc::out_of_range,
                where() + "index " + std::to_string(idx.back()) + " outside the tensor's " +
                    std::to_string(numel) + " elements");
    return t;
  }

  // ---- compiled path

  apply_stats apply_compiled(std::span<const item> items, std::vector<write_record>* log) {
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

  std::uint64_t apply_item_compiled(const item& it, std::vector<write_record>* log) {
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

  apply_stats apply_general(std::span<const item> items, std::vector<write_record>* log) {
    check_writes_.assign(items.size(), 0);
    for (std::size_t k = 0; k < items.size(); ++k) {
      const item& it = items[k];
      if (it.count() == 0 || plan_.skips(it.tensor)) continue;
      check_writes_[k] = run(it, registry_->at(it.tensor), delta_pass::check, nullptr).elements;
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
      const load_record r = run(it, t, delta_pass::write, log);
      DCR_EXPECTS(r.elements == check_writes_[k], errc::unsupported_loader_path,
                  "item_applier::apply: loader placed tensor '" + t.name +
                      "' differently on the write pass than on the check pass (loaders must be "
                      "deterministic); storage may be partially updated, retry with overwrite");
      stats.writes += r.elements;
    }
    return stats;
  }

  load_record run(const item& it, const canonical_tensor& t, delta_pass pass,
                  std::vector<write_record>* log) {
    return visit_word(it.word_bytes(), [&](auto w) {
      using W = decltype(w);
      auto& sink = std::get<delta_sink<W>>(delta_sinks_);
      sink.begin(t, scratch_words<W>(), it.indices, it.template words<W>(), it.enc, pass, log);
      loader_->load(t, scratch_view<W>(t), sink);
      return sink.finish();
    });
  }

  template <storage_word W>
  const W* scratch_words() const noexcept {
    return reinterpret_cast<const W*>(scratch_.data());
  }
  template <storage_word W>
  tensor_view<const W> scratch_view(const canonical_tensor& t) const {
    return tensor_view<const W>::contiguous(scratch_words<W>(), t.shape);
  }

  const tensor_registry* registry_;
  Loader* loader_;
  apply_options options_;
  apply_backend* backend_ = nullptr;  // null: the compiled path's CPU loop
  detail::aligned_scratch scratch_;
  bool prewarmed_ = false;
  placement_plan plan_;
  std::vector<std::uint64_t> check_writes_;  // per item of the current apply(), check pass
  std::vector<write_record> log_;            // writes of the current apply() when verifying
  std::tuple<delta_sink<std::uint8_t>, delta_sink<std::uint16_t>, delta_sink<std::uint32_t>,
             delta_sink<std::uint64_t>>
      delta_sinks_;
  std::tuple<dense_sink<std::uint8_t>, dense_sink<std::uint16_t>, dense_sink<std::uint32_t>,
             dense_sink<std::uint64_t>>
      dense_sinks_;
};

}  // namespace dcr
