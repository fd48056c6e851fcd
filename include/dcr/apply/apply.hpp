// dcr/apply/apply.hpp: the receiver's general in-place apply path, and the dense load through
// the same loader.
//
// `item_applier` owns the receiver's scratch and runs the engine's loader once per item with a
// `delta_sink`, so each item's changed elements land exactly where the engine's own dense load
// would put them (see dcr/apply/sink.hpp for how the sink locates them). It also runs the loader
// with a `dense_sink` for dense refits and restores, so both paths share one placement.
//
// No partial write: validation of payload framing, versions and indices is the decoder's job and
// happens before apply. What only apply can see is the loader's behaviour (a copy from a
// temporary, an overlapping src view, overlapping xor writes, a tensor neither copied nor
// skipped). apply() therefore runs in two passes over the whole span of items:
//   1. check pass: the loader runs for every item with a sink that validates each copy and
//      counts the writes it would make, touching no storage;
//   2. write pass: only if every item passed, the loader runs again and the sink writes.
// An error in pass 1 leaves storage exactly as it was. Pass 2 can only fail if the loader is not
// deterministic (a loader condition): the write counts of both passes are compared and a
// mismatch is reported as errc::unsupported_loader_path; storage may then hold a partial
// transition, which the protocol repairs with an overwrite-only retry.
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

#include "dcr/apply/loader.hpp"
#include "dcr/apply/sink.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// Counters of one apply() call.
struct apply_stats {
  std::uint64_t items = 0;          ///< items in the call
  std::uint64_t records = 0;        ///< records (active canonical elements) in them
  std::uint64_t writes = 0;         ///< destination elements written (replicas count each)
  std::uint64_t skipped_items = 0;  ///< items with records whose tensor this rank does not hold
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
}  // namespace detail

/// Applies decoded items in place through an engine's loader, and dense-loads tensors through
/// the same loader.
///
/// Preconditions of apply(): items were validated by the decoder against `registry` (the
/// applier re-checks the cheap ones: tensor id, dtype, value count, sorted in-range indices,
/// encoding), deduplicated by payload id (dcr::payload_ledger), and, for xor items, storage
/// holds the committed bits those masks were made from. The registry and loader must outlive
/// the applier; the loader must not change its placement between prewarm() and the commit of
/// the transition (call prewarm() again if it does). Not thread-safe: an applier owns one
/// scratch and one set of sinks, so each apply thread of a receiver needs its own.
template <class Loader>
  requires loader<Loader>
class item_applier {
 public:
  item_applier(const tensor_registry& registry, Loader& loader)
      : registry_(&registry), loader_(&loader) {}

  /// Allocates and zeroes the scratch (the largest canonical tensor), then probes the loader
  /// once per tensor with a checking sink: every copy's src must be a non-overlapping view of
  /// the tensor, and every tensor must be copied or explicitly skipped. Records which tensors
  /// this rank skips. Throws errc::unsupported_loader_path (naming the tensor) for a loader that
  /// breaks these conditions, so such a loader fails here, before any transition.
  void prewarm() {
    prewarmed_ = false;
    scratch_.reset(static_cast<std::size_t>(std::max<std::int64_t>(registry_->max_tensor_bytes(), 8)));
    skipped_.assign(registry_->size(), 0);
    const auto tensors = registry_->tensors();
    for (std::size_t id = 0; id < tensors.size(); ++id) {
      const canonical_tensor& t = tensors[id];
      visit_word(dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        auto& sink = std::get<delta_sink<W>>(delta_sinks_);
        sink.begin(t, scratch_words<W>(), {}, {}, encoding::overwrite, delta_pass::check);
        loader_->load(t, scratch_view<W>(t), sink);
        skipped_[id] = sink.finish().skipped ? 1 : 0;
      });
    }
    prewarmed_ = true;
  }

  /// Whether prewarm() completed.
  [[nodiscard]] bool prewarmed() const noexcept { return prewarmed_; }

  /// Whether the loader skips tensor `id` on this rank (as probed by prewarm()).
  [[nodiscard]] bool skips(tensor_id id) const {
    DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::skips: call prewarm() first");
    DCR_EXPECTS(id < skipped_.size(), errc::unknown_tensor,
                "item_applier::skips: no tensor with id " + std::to_string(id));
    return skipped_[id] != 0;
  }

  /// Applies `items` (typically one payload) in place: check pass over all items, then write
  /// pass (see the file comment). Items of tensors this rank skips count in skipped_items and
  /// cost nothing; items without records write nothing. Throws errc::not_ready before
  /// prewarm(); unknown_tensor, dtype_mismatch, invalid_argument, out_of_range or
  /// unsupported_version for a malformed item and unsupported_loader_path for a loader path the
  /// item cannot take: all before the first write.
  apply_stats apply(std::span<const item> items) {
    DCR_EXPECTS(prewarmed_, errc::not_ready, "item_applier::apply: call prewarm() first");
    check_writes_.assign(items.size(), 0);
    for (std::size_t k = 0; k < items.size(); ++k) {
      const item& it = items[k];
      const canonical_tensor& t = validate(it, k);
      if (it.count() == 0 || skipped_[it.tensor]) continue;
      check_writes_[k] = run(it, t, delta_pass::check).elements;
    }
    apply_stats stats;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const item& it = items[k];
      ++stats.items;
      stats.records += it.count();
      if (it.count() == 0) continue;
      if (skipped_[it.tensor]) {
        ++stats.skipped_items;
        continue;
      }
      const canonical_tensor& t = registry_->at(it.tensor);
      const load_record r = run(it, t, delta_pass::write);
      DCR_EXPECTS(r.elements == check_writes_[k], errc::unsupported_loader_path,
                  "item_applier::apply: loader placed tensor '" + t.name +
                      "' differently on the write pass than on the check pass (loaders must be "
                      "deterministic); storage may be partially updated, retry with overwrite");
      stats.writes += r.elements;
    }
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
    const auto numel = static_cast<std::uint64_t>(t.numel());
    const auto& idx = it.indices;
    for (std::size_t i = 0; i < idx.size(); ++i) {
      DCR_EXPECTS(i == 0 || idx[i - 1] < idx[i], errc::invalid_argument,
                  where() + "indices not strictly increasing at record " + std::to_string(i));
    }
    DCR_EXPECTS(idx.empty() || idx.back() < numel, errc::out_of_range,
                where() + "index " + std::to_string(idx.back()) + " outside the tensor's " +
                    std::to_string(numel) + " elements");
    return t;
  }

  load_record run(const item& it, const canonical_tensor& t, delta_pass pass) {
    return visit_word(it.word_bytes(), [&](auto w) {
      using W = decltype(w);
      auto& sink = std::get<delta_sink<W>>(delta_sinks_);
      sink.begin(t, scratch_words<W>(), it.indices, it.template words<W>(), it.enc, pass);
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
  detail::aligned_scratch scratch_;
  bool prewarmed_ = false;
  std::vector<unsigned char> skipped_;        // per tensor id, from the prewarm probe
  std::vector<std::uint64_t> check_writes_;   // per item of the current apply(), check pass
  std::tuple<delta_sink<std::uint8_t>, delta_sink<std::uint16_t>, delta_sink<std::uint32_t>,
             delta_sink<std::uint64_t>>
      delta_sinks_;
  std::tuple<dense_sink<std::uint8_t>, dense_sink<std::uint16_t>, dense_sink<std::uint32_t>,
             dense_sink<std::uint64_t>>
      dense_sinks_;
};

}  // namespace dcr
