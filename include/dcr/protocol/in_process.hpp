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

#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/memory_control_plane.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/receiver_agent.hpp"

namespace dcr {

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
  std::uint64_t payloads = 0, payload_bytes = 0, records = 0, changed_elements = 0;
  std::uint64_t compared_bytes = 0;
  std::uint64_t residual_compared_bytes = 0, residual_changed_inputs = 0;
  std::uint64_t residual_conversions = 0, residual_changed_elements = 0, residual_items = 0;
  std::uint64_t forced_overwrite_items = 0;
  std::uint64_t duplicates_dropped = 0, corrupt_refetched = 0, stale_refused = 0;
  double detect_seconds = 0, project_seconds = 0, encode_seconds = 0, compress_seconds = 0;
  double residual_detect_seconds = 0, convert_seconds = 0, residual_compare_seconds = 0;
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
/// sources (the fault injection of tests/support/dcr/testing/faults.hpp) without knowing their
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
                   std::span<receiver_endpoint* const> receivers, std::uint64_t version = 0)
      : registry_(&registry), owners_(owners.begin(), owners.end()) {
    const auto deadline = protocol_clock::now() + std::chrono::seconds(30);
    std::vector<std::uint32_t> ids;
    for (auto& b : owners_) ids.push_back(b.owner_ptr->id());
    coordinator_options co;
    co.min_receivers = receivers.size();
    coordinator_ = std::make_unique<coordinator<plane_type, store_type>>(
        plane_, store_, registry.fingerprint(), ids, co);
    coordinator_->initialize(version, deadline);
    for (auto& b : owners_) {
      owner_agents_.push_back(std::make_unique<owner_agent<plane_type, store_type>>(
          *b.owner_ptr, registry, plane_, store_));
      owner_agents_.back()->start(version, deadline);
    }
    for (std::size_t r = 0; r < receivers.size(); ++r) {
      base_sources_.push_back(std::make_unique<erased_source<store_source<store_type>>>(store_));
      refs_.push_back(std::make_unique<source_ref>());
      refs_.back()->point_at(*base_sources_.back());
      receiver_agents_.push_back(std::make_unique<receiver_agent<plane_type, source_ref>>(
          "receiver-" + std::to_string(r), *receivers[r], registry.fingerprint(), plane_,
          *refs_.back()));
      receiver_agents_.back()->start(version, true, deadline);
    }
  }

  /// Runs the transition from the committed version to the next for the owners' current
  /// candidates (see the file comment). `decorate` wraps each receiver's source for this run.
  transition_report run(const refit_options& options = {}, const source_decorator& decorate = {}) {
    const auto deadline = protocol_clock::now() + std::chrono::seconds(300);
    const std::uint64_t v = version();
    const std::string candidate = "run " + std::to_string(++runs_);
    std::vector<std::unique_ptr<payload_source_base>> decorated(receiver_agents_.size());
    for (std::size_t r = 0; r < receiver_agents_.size(); ++r) {
      if (decorate) decorated[r] = decorate(r, *base_sources_[r]);
      refs_[r]->point_at(decorated[r] ? *decorated[r] : *base_sources_[r]);
    }
    coordinator_options co = coordinator_->options();
    co.policy = options.policy;
    co.max_attempts = options.max_attempts;
    co.min_receivers = 0;
    co.erase_after_commit = !options.keep_payloads;
    coordinator<plane_type, store_type> coord(plane_, store_, registry_->fingerprint(), owner_ids(), co);
    for (auto& a : owner_agents_) a->set_codec(options.bucket_bytes, options.codec);

    std::atomic<bool> stop{false};
    std::atomic<std::size_t> running{owner_agents_.size() + receiver_agents_.size()};
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < owner_agents_.size(); ++k)
      threads.emplace_back([&, k] {
        try {
          owner_agents_[k]->serve_transition(candidate, owners_[k].candidates,
                                             owners_[k].residual_inputs, deadline, &stop);
        } catch (const error&) {  // stopped, or the transition did not commit
        }
        --running;
      });
    for (auto& a : receiver_agents_)
      threads.emplace_back([&, agent = a.get()] {
        try {
          agent->serve_until(v + 1, deadline, &stop);
        } catch (const error&) {
        }
        --running;
      });
    transition_summary summary;
    std::exception_ptr failure;
    try {
      summary = coord.run_transition(candidate, deadline);
    } catch (...) {
      failure = std::current_exception();
    }
    // After a commit every agent finishes by itself (owners update their trackers, receivers
    // end the transition); otherwise they are told to stop.
    // (An agent that has not finished a few seconds after a commit, e.g. a receiver the
    // committed attempt did not require, is stopped too; it catches up in the next run().)
    const auto grace = protocol_clock::now() + std::chrono::seconds(failure || !summary.committed ? 0 : 10);
    while (running.load() > 0 && protocol_clock::now() < grace)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (running.load() > 0) {
      stop = true;
      put(plane_, "/dcr/wake", std::to_string(runs_));  // wake every waiter
    }
    for (auto& t : threads) t.join();
    for (auto& ref : refs_) ref->point_at(*base_sources_[&ref - &refs_[0]]);
    if (failure) std::rethrow_exception(failure);
    return to_report(summary);
  }

  /// The committed version.
  [[nodiscard]] std::uint64_t version() {
    return read_record<commit_record>(plane_, protocol_keys{}.commit())->value.version;
  }
  [[nodiscard]] plane_type& plane() noexcept { return plane_; }
  [[nodiscard]] store_type& store() noexcept { return store_; }

 private:
  std::vector<std::uint32_t> owner_ids() const {
    std::vector<std::uint32_t> ids;
    for (const auto& b : owners_) ids.push_back(b.owner_ptr->id());
    return ids;
  }

  transition_report to_report(const transition_summary& s) {
    transition_report out;
    out.base_version = s.base_version;
    out.target_version = s.target_version;
    out.committed = s.committed;
    out.seconds = s.seconds;
    for (const auto& a : s.attempts) {
      if (a.kind != attempt_kind::refit) continue;
      attempt_report r;
      r.attempt = a.key.attempt;
      r.policy = a.policy;
      r.succeeded = a.committed;
      r.failure = a.failure;
      r.seconds = a.seconds;
      if (a.committed) r.commit_seconds = s.commit_seconds;
      for (const auto& o : a.reports) {
        r.payloads += o.payloads;
        r.payload_bytes += o.payload_bytes;
        r.records += o.records;
        r.changed_elements += o.changed_elements;
        r.compared_bytes += o.compared_bytes;
        r.residual_compared_bytes += o.residual_compared_bytes;
        r.residual_changed_inputs += o.residual_changed_inputs;
        r.residual_conversions += o.residual_conversions;
        r.residual_changed_elements += o.residual_changed_elements;
        r.residual_items += o.residual_items;
        r.forced_overwrite_items += o.forced_overwrite_items;
        r.detect_seconds += o.detect_seconds;
        r.project_seconds += o.project_seconds;
        r.encode_seconds += o.encode_seconds;
        r.compress_seconds += o.compress_seconds;
        r.residual_detect_seconds += o.residual_detect_seconds;
        r.convert_seconds += o.convert_seconds;
        r.residual_compare_seconds += o.residual_compare_seconds;
      }
      for (const auto& k : a.acks) {
        r.duplicates_dropped += k.duplicates;
        r.corrupt_refetched += k.refetched;
        r.stale_refused += k.stale;
        r.apply_seconds += k.apply_seconds;
      }
      out.attempts.push_back(std::move(r));
    }
    // The union of the receivers' overwrite-only tensors, as the attempts carried it.
    for (const auto& reg : read_records<receiver_registration>(plane_, protocol_keys{}.receivers()))
      out.overwrite_only_tensors.insert(out.overwrite_only_tensors.end(), reg.overwrite_only.begin(),
                                        reg.overwrite_only.end());
    std::sort(out.overwrite_only_tensors.begin(), out.overwrite_only_tensors.end());
    out.overwrite_only_tensors.erase(
        std::unique(out.overwrite_only_tensors.begin(), out.overwrite_only_tensors.end()),
        out.overwrite_only_tensors.end());
    return out;
  }

  const tensor_registry* registry_;
  std::vector<owner_binding> owners_;
  plane_type plane_;
  store_type store_;
  std::unique_ptr<coordinator<plane_type, store_type>> coordinator_;
  std::vector<std::unique_ptr<owner_agent<plane_type, store_type>>> owner_agents_;
  std::vector<std::unique_ptr<payload_source_base>> base_sources_;
  std::vector<std::unique_ptr<source_ref>> refs_;
  std::vector<std::unique_ptr<receiver_agent<plane_type, source_ref>>> receiver_agents_;
  std::uint64_t runs_ = 0;
};

}  // namespace dcr
