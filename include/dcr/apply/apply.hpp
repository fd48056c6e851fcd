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
  void reset(std::size_t bytes);
  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, deleter> data_;
  std::size_t bytes_ = 0;
};

/// Whether p[0 .. n) is strictly increasing with every value below 2^63 (a branch-free pass;
/// false says only that one of the two fails).
bool increasing_below_2_63(const std::uint64_t* p, std::size_t n) noexcept;

/// Checks every write of an apply against its record (see the file comment). Throws
/// errc::verification_failed naming the tensor and canonical element of the first mismatch.
std::uint64_t verify_writes(std::span<const write_record> log);
}  // namespace detail

/// The loader-independent part of item_applier: validation, the compiled path, the general
/// path's two passes and the post-apply checks. It never calls the loader itself: the general
/// path's loader runs go through run_loader(), which item_applier<Loader> implements.
///
/// Preconditions of apply(): items were validated by the decoder against `registry` (the
/// applier re-checks the cheap ones: tensor id, dtype, value count, sorted in-range indices,
/// encoding), deduplicated by payload id (dcr::payload_ledger), and, for xor/ulp items, storage
/// holds the committed bits those values were made from. Not thread-safe: an applier owns one
/// scratch, one plan and one set of sinks, so each apply thread of a receiver needs its own.
class item_applier_base {
 public:
  item_applier_base(const item_applier_base&) = delete;
  item_applier_base& operator=(const item_applier_base&) = delete;

  /// Runs the compiled path's writes through `backend` from now on (dcr/apply/apply_backend.hpp;
  /// e.g. into a GPU's copy of the storage); nullptr returns to the CPU loop (the default).
  /// Validation stays here, before any write. With a backend, apply() refuses the general path
  /// and post-apply checks (errc::invalid_argument, nothing written): both work on the host
  /// storage. On a prewarmed applier the backend is prepared with the plan at once. The backend
  /// must outlive its use.
  void set_backend(apply_backend* backend);

  /// Where the compiled path writes: "cpu" or the backend's device().
  [[nodiscard]] std::string apply_device() const;

  /// Whether prewarm() completed.
  [[nodiscard]] bool prewarmed() const noexcept { return prewarmed_; }

  /// The options apply(items) uses.
  [[nodiscard]] const apply_options& options() const noexcept { return options_; }
  void set_options(const apply_options& options) noexcept { options_ = options; }

  /// Whether the loader skips tensor `id` on this rank (as probed by prewarm()).
  [[nodiscard]] bool skips(tensor_id id) const;

  /// Canonical tensors this rank takes only as overwrite records, ascending (after prewarm()).
  [[nodiscard]] std::span<const tensor_id> overwrite_only_tensors() const;

  /// The compiled placement: records and the per-tensor report (after prewarm()).
  [[nodiscard]] const placement_plan& plan() const;

  /// Applies `items` (typically one payload) in place with options(). See the overload.
  apply_stats apply(std::span<const item> items) { return apply(items, options_); }

  /// Applies `items` in place on `options.path`, then, with `options.verify`, checks every
  /// write. Items of tensors this rank skips count in skipped_items and cost nothing; items
  /// without records write nothing. Throws errc::not_ready before prewarm(); unknown_tensor,
  /// dtype_mismatch, invalid_argument, out_of_range or unsupported_version for a malformed item,
  /// unsupported_loader_path for an xor/ulp item of an overwrite-only tensor (and, on the
  /// general path, a loader path the item cannot take): all before the first write.
  /// verification_failed after the writes when a post-apply check fails.
  apply_stats apply(std::span<const item> items, const apply_options& options);

 protected:
  item_applier_base(const tensor_registry& registry, apply_options options)
      : registry_(&registry), options_(options) {}
  virtual ~item_applier_base();

  /// prewarm()'s first step: clears the plan and returns the zeroed scratch (the largest
  /// canonical tensor, at least 8 bytes), for compile_placement.
  std::span<std::byte> begin_prewarm();
  /// prewarm()'s last step: takes the compiled plan (and prepares the backend with it).
  void end_prewarm(placement_plan plan);
  /// The dense load's checks: W's width is the tensor's word width (dtype_mismatch), the view's
  /// extents are its canonical shape (shape_mismatch). Returns the tensor.
  const canonical_tensor& check_dense_view(tensor_id id, std::size_t word_bytes, int rank,
                                           const std::int64_t* extents) const;
  /// The general path's loader run for item `it` of tensor `t` in pass `pass` (a delta_sink
  /// over the scratch, see dcr/apply/sink.hpp); returns what the loader did.
  virtual load_record run_loader(const item& it, const canonical_tensor& t, delta_pass pass,
                                 std::vector<write_record>* log) = 0;

  /// The scratch as a canonical tensor of words W (zero outside the general path's runs).
  template <storage_word W>
  [[nodiscard]] tensor_view<const W> scratch_view(const canonical_tensor& t) const {
    return tensor_view<const W>::contiguous(reinterpret_cast<const W*>(scratch_.data()), t.shape);
  }

  const tensor_registry* registry_;

 private:
  const canonical_tensor& validate(const item& it, std::size_t k) const;
  apply_stats apply_compiled(std::span<const item> items, std::vector<write_record>* log);
  std::uint64_t apply_item_compiled(const item& it, std::vector<write_record>* log);
  apply_stats apply_general(std::span<const item> items, std::vector<write_record>* log);

  apply_options options_;
  apply_backend* backend_ = nullptr;  // null: the compiled path's CPU loop
  detail::aligned_scratch scratch_;
  bool prewarmed_ = false;
  placement_plan plan_;
  std::vector<std::uint64_t> check_writes_;  // per item of the current apply(), check pass
  std::vector<write_record> log_;            // writes of the current apply() when verifying
};

/// Applies decoded items in place through an engine's loader, and dense-loads tensors through
/// the same loader (item_applier_base holds everything that does not call the loader).
///
/// The registry, loader and engine storage must outlive the applier; the loader must not
/// change its placement (nor the engine move its storage) between prewarm() and the commit of
/// the transition (call prewarm() again if it does).
template <class Loader>
  requires loader<Loader>
class item_applier : public item_applier_base {
 public:
  item_applier(const tensor_registry& registry, Loader& loader, apply_options options = {})
      : item_applier_base(registry, options), loader_(&loader) {}

  /// Allocates and zeroes the scratch (the largest canonical tensor), then compiles the
  /// loader's placement (dcr::compile_placement): probes every tensor, records where its
  /// elements land and which tensors this rank skips, and decides which tensors are
  /// overwrite-only. Throws errc::unsupported_loader_path (naming the tensor) for a loader that
  /// breaks a loader condition, so such a loader fails here, before any transition.
  void prewarm() {
    const std::span<std::byte> scratch = begin_prewarm();
    end_prewarm(compile_placement(*registry_, *loader_, scratch.data(), scratch.size()));
  }

  /// Dense load of canonical tensor `id` from `canonical_words` (any view with the canonical
  /// shape) through the loader: copies every element the loader places on this rank. This is
  /// the dense refit, and the restore a joining receiver performs. Needs no prewarm(). Throws
  /// dtype_mismatch when W is not the tensor's word width, shape_mismatch when the view's
  /// extents differ from the canonical shape, unsupported_loader_path when the loader neither
  /// copies nor skips the tensor. Returns what the loader did (copies, elements, skipped).
  template <storage_word W>
  load_record dense_load(tensor_id id, tensor_view<const W> canonical_words) {
    const canonical_tensor& t = check_dense_view(id, sizeof(W), canonical_words.rank(),
                                                 canonical_words.extents().data());
    auto& sink = std::get<dense_sink<W>>(dense_sinks_);
    sink.clear_log();
    sink.begin(t);
    loader_->load(t, canonical_words, sink);
    return sink.finish();
  }

 private:
  load_record run_loader(const item& it, const canonical_tensor& t, delta_pass pass,
                         std::vector<write_record>* log) override {
    return visit_word(it.word_bytes(), [&](auto w) {
      using W = decltype(w);
      auto& sink = std::get<delta_sink<W>>(delta_sinks_);
      const tensor_view<const W> scratch = scratch_view<W>(t);
      sink.begin(t, scratch.data(), it.indices, it.template words<W>(), it.enc, pass, log);
      loader_->load(t, scratch, sink);
      return sink.finish();
    });
  }

  Loader* loader_;
  std::tuple<delta_sink<std::uint8_t>, delta_sink<std::uint16_t>, delta_sink<std::uint32_t>,
             delta_sink<std::uint64_t>>
      delta_sinks_;
  std::tuple<dense_sink<std::uint8_t>, dense_sink<std::uint16_t>, dense_sink<std::uint32_t>,
             dense_sink<std::uint64_t>>
      dense_sinks_;
};

}  // namespace dcr

#include "dcr/detail/apply/apply.inl"
