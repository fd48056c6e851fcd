// dcr/protocol/in_process.hpp: a whole refit deployment in one process, as a thin composition
// of the same agents that run across processes: a memory control plane and payload store, one
// owner agent thread per owner, one receiver agent thread per receiver, and the coordinator on
// the calling thread. For tests, benchmarks and single-process users; there is no second
// implementation of the protocol here.
//
// A transition that an earlier run() left uncommitted (its last attempt fenced) is continued by
// the next run(): the next attempt number, overwrite only, and the owners send the union of
// every element any attempt of the transition sent, so a retry with changed candidates still
// ends bit-exact.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/options.hpp"
#include "dcr/config.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/refit/owner.hpp"
#include "dcr/refit/receiver.hpp"

namespace dcr {

class memory_control_plane;   // dcr/protocol/plane/memory_control_plane.hpp
class memory_payload_store;   // dcr/protocol/payload_store.hpp

/// What one refit does (the in-process driver's knobs).
struct refit_options {
  encoding_policy policy = encoding_policy::mixed;  ///< first attempt; retries overwrite only
  std::size_t bucket_bytes = std::size_t{64} << 20;  ///< raw record bytes per payload (about)
  codec_options codec{};
  std::uint32_t max_attempts = 3;  ///< refit attempts one run() may make
  bool keep_payloads = false;      ///< leave the committed transition's payloads in the store
};

/// An owner and the candidate shards of its tasks: candidates[i] for owner::tasks()[i], and the
/// inputs of its residual tasks flattened in task order (see dcr/refit/owner.hpp).
struct owner_binding {
  owner* owner_ptr;
  std::vector<std::span<const std::byte>> candidates;
  std::vector<std::span<const std::byte>> residual_inputs{};
};

/// One attempt of a run(), summed over owners and receivers.
struct attempt_report {
  std::uint32_t attempt = 0;
  encoding_policy policy = encoding_policy::mixed;
  bool succeeded = false;
  std::string failure;
  std::uint64_t payloads = 0, payload_bytes = 0, records = 0;
  owner_stats owners;         ///< the owners' figures (owner_report::stats), summed over owners
  std::uint64_t duplicates_dropped = 0, corrupt_refetched = 0, stale_refused = 0;
  double compress_seconds = 0;  ///< pack + zstd, summed over owners
  double apply_seconds = 0;   ///< decode + apply, summed over receivers
  double commit_seconds = 0;
  double seconds = 0;         ///< attempt record written to outcome
};

struct transition_report {
  std::uint64_t base_version = 0, target_version = 0;
  bool committed = false;
  std::vector<tensor_id> overwrite_only_tensors;  ///< union over receivers (sorted)
  std::vector<attempt_report> attempts;
  double seconds = 0;  ///< prepare to commit
};

/// A payload source behind a virtual interface, so the driver can hand receivers decorated
/// sources (the fault injection of tools/sim/dcr/testing/faults.hpp) without knowing their
/// types.
class payload_source_base {
 public:
  virtual ~payload_source_base() = default;
  virtual void open(const attempt_key& key, std::span<const std::uint32_t> owners) = 0;
  virtual source_status next(delivery& out, protocol_clock::time_point deadline) = 0;
  virtual bool refetch(const payload_id& id, std::vector<std::byte>& bytes) = 0;
};

/// Any payload source as a payload_source_base (owning it).
template <payload_source S>
class erased_source final : public payload_source_base {
 public:
  template <class... Args>
  explicit erased_source(Args&&... args) : source_(std::forward<Args>(args)...) {}
  void open(const attempt_key& key, std::span<const std::uint32_t> owners) override {
    source_.open(key, owners);
  }
  source_status next(delivery& out, protocol_clock::time_point deadline) override {
    return source_.next(out, deadline);
  }
  bool refetch(const payload_id& id, std::vector<std::byte>& bytes) override {
    return source_.refetch(id, bytes);
  }
  S& get() noexcept { return source_; }

 private:
  S source_;
};

/// A payload source that forwards to whichever payload_source_base it points at.
class source_ref {
 public:
  using payload_source_concept = payload_source_tag;
  void point_at(payload_source_base& s) noexcept { target_ = &s; }
  void open(const attempt_key& key, std::span<const std::uint32_t> owners) { target_->open(key, owners); }
  source_status next(delivery& out, protocol_clock::time_point deadline) {
    return target_->next(out, deadline);
  }
  bool refetch(const payload_id& id, std::vector<std::byte>& bytes) {
    return target_->refetch(id, bytes);
  }
 private:
  payload_source_base* target_ = nullptr;
};

/// Wraps receiver `r`'s source for one run() (faults in tests); returns the source to use.
using source_decorator =
    std::function<std::unique_ptr<payload_source_base>(std::size_t receiver, payload_source_base& inner)>;

class in_process_refit {
 public:
  using plane_type = memory_control_plane;
  using store_type = memory_payload_store;

  /// Every owner must be initialize()d and every receiver prewarmed and loaded with `version`.
  /// The bindings and receivers must outlive the driver.
  in_process_refit(const tensor_registry& registry, std::span<owner_binding> owners,
                   std::span<receiver_endpoint* const> receivers, std::uint64_t version = 0);
  in_process_refit(const in_process_refit&) = delete;
  in_process_refit& operator=(const in_process_refit&) = delete;
  /// Stops nothing: run() has joined its agents' threads before it returns.
  ~in_process_refit();

  /// Runs the transition from the committed version to the next for the owners' current
  /// candidates (see the file comment). `decorate` wraps each receiver's source for this run.
  transition_report run(const refit_options& options = {}, const source_decorator& decorate = {});
  /// The committed version.
  [[nodiscard]] std::uint64_t version();
  /// The deployment's control plane and payload store (include their headers to use them).
  [[nodiscard]] plane_type& plane() noexcept;
  [[nodiscard]] store_type& store() noexcept;

 private:
  /// The plane, the store, the coordinator and the agents (dcr/detail/protocol/in_process.inl).
  struct deployment;

  const tensor_registry* registry_;
  std::vector<owner_binding> owners_;
  std::unique_ptr<deployment> d_;
  std::uint64_t runs_ = 0;
};

}  // namespace dcr

#include "dcr/detail/protocol/in_process.inl"
