// dcr/refit/receiver.hpp: one serving rank's side of the protocol: validate, deduplicate and
// apply payloads in place through the engine's native loader.
//
// A receiver is bound to one model (tensor registry) and one engine loader. Per transition it
// is told which attempt is current (begin_attempt); payloads of any other transition or attempt
// are refused as stale (that is how a failed attempt is fenced: its late payloads can no longer
// land). Each payload is fully decoded and validated before its first write, applied at most
// once per transition, and applied through item_applier (compiled placement by default, or the
// general loader-per-item path; see dcr/apply/apply.hpp) after every item passed validation, so
// a bad payload changes nothing. prewarm() compiles the loader's placement and fixes which
// tensors this receiver takes as overwrite only (overwrite_only_tensors(), placement_report()):
// an xor/ulp record for one of them is refused before any write.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/apply/dedupe.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/config.hpp"

namespace dcr {

/// What happened to one delivered payload.
enum class apply_outcome {
  applied,    ///< validated and written
  duplicate,  ///< already applied in this transition; dropped without a write
};

/// Counters a receiver keeps for the current transition.
struct receiver_stats {
  std::uint64_t payloads_applied = 0;
  std::uint64_t duplicates_dropped = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t records = 0;
  std::uint64_t writes = 0;
  std::uint64_t verified = 0;  ///< writes checked by post-apply checks
  /// The current attempt's distinct applied payloads (duplicates of applied ones count once):
  /// how many, and their set digest (payload_id_digest summed), which the coordinator compares
  /// with the owners' manifests before it commits.
  std::uint64_t attempt_payloads = 0;
  std::uint64_t attempt_payload_digest = 0;
  double decode_seconds = 0;
  double apply_seconds = 0;
};

/// The protocol interface of a receiver, independent of its loader type (the coordinator talks
/// to receivers of different engines through it).
class receiver_endpoint {
 public:
  virtual ~receiver_endpoint() = default;
  /// Makes `key` the only attempt whose payloads are accepted; resets deduplication when the
  /// transition changes.
  virtual void begin_attempt(const attempt_key& key) = 0;
  /// Validates, deduplicates and applies one payload. Throws dcr::error (stale_payload,
  /// corrupt_payload, ...) with storage unchanged, except where the writes had begun (a failed
  /// post-apply check, verification_failed, or a backend failing mid-write): storage may then
  /// hold part of the payload, which a second apply would not undo (xor records applied twice
  /// restore the old bits), so every later payload of the same attempt is refused with that
  /// error too, and only the next attempt (begin_attempt) is accepted again.
  virtual apply_outcome apply_payload(std::span<const std::byte> bytes) = 0;
  /// The storage holds version `version`: its transition committed, a restore of it finished,
  /// or (before an agent's first attempt) it was loaded from a checkpoint. committed_version()
  /// says it from then on.
  virtual void end_transition(std::uint64_t version) = 0;
  /// The version given to the last end_transition (0 before any): the version this receiver
  /// holds. The receiver is the one place of that fact; a receiver agent reads it here.
  [[nodiscard]] virtual std::uint64_t committed_version() const noexcept = 0;
  /// Counters since the last begin of a transition.
  [[nodiscard]] virtual const receiver_stats& stats() const = 0;
  /// Canonical tensors this receiver can take only as overwrite records (its loader path does
  /// not preserve bits, or another write overlaps), sorted ascending; valid after prewarm.
  /// Owners must not send xor/ulp records for them.
  [[nodiscard]] virtual std::span<const tensor_id> overwrite_only_tensors() const = 0;
};

/// The loader-independent part of receiver<Loader>: the attempt fence, deduplication,
/// decoding and the apply through an item_applier_base (see receiver_endpoint for the
/// contract). receiver<Loader> adds what calls the loader: prewarm() and dense_load().
class receiver_base : public receiver_endpoint {
 public:
  receiver_base(const receiver_base&) = delete;
  receiver_base& operator=(const receiver_base&) = delete;

  /// Runs the compiled path's writes through `backend` (e.g. a GPU holding this rank's weights;
  /// see item_applier_base::set_backend and dcr/apply/apply_backend.hpp); nullptr: the CPU loop.
  void set_apply_backend(apply_backend* backend) { applier_->set_backend(backend); }
  /// Where the compiled path writes: "cpu" or the backend's device().
  [[nodiscard]] std::string apply_device() const { return applier_->apply_device(); }

  /// The apply options used by apply_payload(bytes); switchable between payloads (per refit).
  [[nodiscard]] const apply_options& options() const noexcept { return applier_->options(); }
  void set_options(const apply_options& options) noexcept { applier_->set_options(options); }

  /// Per canonical tensor (by id): skipped, copies, records, elements, overwrite-only and why.
  /// Throws errc::not_ready before prewarm().
  [[nodiscard]] std::span<const tensor_placement> placement_report() const {
    return applier_->plan().report();
  }

  /// The compiled placement (records and report). Throws errc::not_ready before prewarm().
  [[nodiscard]] const placement_plan& plan() const { return applier_->plan(); }

  void begin_attempt(const attempt_key& key) override;

  apply_outcome apply_payload(std::span<const std::byte> bytes) override {
    return apply_payload(bytes, applier_->options());
  }

  /// apply_payload with explicit options for this payload (path, post-apply checks).
  apply_outcome apply_payload(std::span<const std::byte> bytes, const apply_options& options);

  void end_transition(std::uint64_t version) override;

  [[nodiscard]] const receiver_stats& stats() const override { return stats_; }
  /// Empty before prewarm().
  [[nodiscard]] std::span<const tensor_id> overwrite_only_tensors() const override;
  [[nodiscard]] std::uint64_t committed_version() const noexcept override {
    return committed_version_;
  }

 protected:
  /// `applier` (the derived receiver's) must outlive this object; it is not used here before
  /// the derived constructor has finished.
  receiver_base(const tensor_registry& registry, item_applier_base& applier)
      : registry_(&registry), applier_(&applier) {}
  ~receiver_base() override;

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
  /// The errors item_applier_base::apply raises before its first write (its contract).
  static bool refused_before_writes(errc code);

  const tensor_registry* registry_;
  item_applier_base* applier_;
  payload_decoder decoder_;
  payload_ledger ledger_;
  std::vector<item> items_;
  attempt_key current_{};
  /// Set when a payload of the current attempt failed after its writes began (see
  /// receiver_endpoint::apply_payload): the error every later payload of the attempt gets.
  std::optional<std::pair<errc, std::string>> written_failure_;
  bool has_attempt_ = false;
  std::uint64_t committed_version_ = 0;
  receiver_stats stats_;
};

namespace detail {
/// Holds a receiver's item_applier ahead of its receiver_base (the base-from-member idiom), so
/// the applier is constructed first and destroyed last.
template <class Loader>
struct receiver_applier {
  item_applier<Loader> applier;
};
}  // namespace detail

/// A receiver whose engine places tensors through `Loader` (dcr/apply/loader.hpp).
template <class Loader>
class receiver final : private detail::receiver_applier<Loader>, public receiver_base {
 public:
  /// The registry, loader and engine storage must outlive the receiver. `options` choose the
  /// apply path (compiled by default) and post-apply checks for every payload.
  receiver(const tensor_registry& registry, Loader& loader, apply_options options = {})
      : detail::receiver_applier<Loader>{item_applier<Loader>(registry, loader, options)},
        receiver_base(registry, this->applier) {}

  /// Reserves scratch and compiles the loader's placement (see item_applier::prewarm). Call
  /// once before the first transition and again whenever the engine's placement changes or its
  /// storage moves. Throws errc::unsupported_loader_path naming the tensor for a loader path
  /// dcr cannot apply through.
  void prewarm() { this->applier.prewarm(); }

  /// Loads one canonical tensor densely through the same loader (initial load, dense restore of
  /// the committed version by a receiver that joins between attempts).
  template <storage_word W>
  void dense_load(tensor_id id, tensor_view<const W> canonical_words) {
    this->applier.template dense_load<W>(id, canonical_words);
  }
};

}  // namespace dcr

#include "dcr/detail/refit/receiver.inl"
