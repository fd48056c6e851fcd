// dcr/protocol/receiver_agent.hpp: the engine side of the protocol for one receiver, in the
// engine's process (its own thread): registration, dense restore when joining, fencing,
// pipelined delivery and apply, acknowledgement, the request gate, and the end of a transition
// at the joint commit.
//
// States (docs/protocol.md has the whole machine):
//   joining   -> registered with restored = false; the coordinator opens a restore attempt
//                (v -> v) for it; every payload is a dense overwrite of version v; then it
//                acknowledges `restored` and becomes a member at the next attempt
//   idle      -> member holding version v
//   applying  -> an open refit attempt of v -> v+1 requires it: payloads are fetched on the
//                calling thread and applied on a second one (at most queue_depth in flight);
//                synchronous mode closes the gate before the first write, asynchronous mode
//                first stages every compressed payload in host memory while the engine keeps
//                serving v, then closes the gate and applies
//   acked     -> `applied` (everything listed applied), `fenced` (the attempt record left
//                `open`: it stops between payloads, so no write of the attempt lands after the
//                ack) or `failed` (a payload failed validation twice, or a deadline)
//   committed -> the commit record says v+1: end of transition, the gate reopens
// A payload that fails validation is fetched once more (a damaged download) before the
// receiver gives up; payloads of another attempt are refused as stale and counted.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "dcr/pipeline.hpp"
#include "dcr/protocol/agent_support.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/refit/receiver.hpp"

namespace dcr {

/// The engine's callbacks around a refit: close() stops admitting requests (and returns once
/// in-flight ones no longer read the weights), open() resumes. Either may be empty.
struct request_gate {
  std::function<void()> close;
  std::function<void()> open;
};

struct receiver_agent_options {
  protocol_keys keys{};
  bool asynchronous = false;      ///< stage payloads while serving, apply after the last one
  std::size_t queue_depth = 2;    ///< payloads between fetch and apply
  std::chrono::seconds lease_ttl{10};
  /// Test hook, called after each applied payload (attempt, payloads applied so far); the
  /// simulate tool kills the process here for `--kill receiver:STEP`.
  std::function<void(const attempt_record&, std::uint64_t)> after_apply;
};

template <control_plane Plane, payload_source Source>
class receiver_agent {
 public:
  /// The receiver (prewarmed), control plane and source must outlive the agent.
  receiver_agent(std::string name, receiver_endpoint& rx, std::uint64_t registry_fingerprint,
                 Plane& plane, Source& source, receiver_agent_options options = {},
                 request_gate gate = {})
      : name_(std::move(name)), rx_(&rx), fingerprint_(registry_fingerprint), plane_(&plane),
        source_(&source), options_(std::move(options)), gate_(std::move(gate)),
        incarnation_(make_incarnation()) {}
  ~receiver_agent() {
    keeper_.reset();
    if (lease_ != 0) {
      try {
        plane_->revoke(lease_);
      } catch (const error&) {
      }
    }
  }

  /// Registers. `restored`: the storage already holds `committed_version` (a dense load from
  /// its checkpoint); otherwise the coordinator restores it before it joins.
  void start(std::uint64_t committed_version, bool restored, protocol_clock::time_point deadline) {
    committed_ = committed_version;
    restored_ = restored;
    with_retry("receiver agent: register", deadline, [&] {
      lease_ = plane_->grant_lease(options_.lease_ttl);
      register_self();
      return 0;
    });
    keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
  }

  /// Serves attempts until the commit record reaches `version` and this receiver holds it;
  /// returns the committed version. Throws deadline_exceeded at `deadline`.
  std::uint64_t serve_until(std::uint64_t version, protocol_clock::time_point deadline,
                            const std::atomic<bool>* stop = nullptr) {
    DCR_EXPECTS(lease_ != 0, errc::not_ready, "receiver agent: serve before start");
    const auto& keys = options_.keys;
    stop_ = stop;
    for (;;) {
      DCR_EXPECTS(stop == nullptr || !stop->load(), errc::not_ready, "receiver agent: stopped");
      if (!keeper_->alive()) {  // the lease expired (an outage longer than its ttl): it comes
        keeper_.reset();         // back as a new incarnation (restored if its storage is clean)
        incarnation_ = make_incarnation();
        with_retry("receiver agent: re-register", deadline, [&] {
          lease_ = plane_->grant_lease(options_.lease_ttl);
          register_self();
          return 0;
        });
        keeper_ = std::make_unique<lease_keeper<Plane>>(*plane_, lease_, options_.lease_ttl);
      }
      const std::int64_t seen =
          with_retry("receiver agent: revision", deadline, [&] { return plane_->revision(); });
      const auto commit = with_retry("receiver agent: read commit", deadline, [&] {
        return read_record<commit_record>(*plane_, keys.commit());
      });
      if (commit && restored_ && applied_ && commit->value.version == committed_ + 1 &&
          commit->value.attempt == applied_key_.number) {
        // The transition this receiver applied was committed.
        rx_->end_transition(commit->value.version);
        committed_ = commit->value.version;
        applied_ = false;
        dirty_ = false;
        with_retry("receiver agent: update registration", deadline, [&] {
          register_self();
          return 0;
        });
        if (gate_closed_ && gate_.open) gate_.open();
        gate_closed_ = false;
      }
      if (commit && committed_ >= version && restored_ && commit->value.version == committed_)
        return committed_;
      const auto attempt = with_retry("receiver agent: read attempt", deadline, [&] {
        return read_record<attempt_record>(*plane_, keys.attempt());
      });
      if (attempt && attempt->value.state == attempt_state::open &&
          std::find(attempt->value.receivers.begin(), attempt->value.receivers.end(), name_) !=
              attempt->value.receivers.end() &&
          !acked(attempt->value.key)) {
        const auto& a = attempt->value;
        const bool restore = a.kind == attempt_kind::restore;
        if ((restore && a.key.base_version >= committed_) ||
            (!restore && restored_ && a.key.base_version == committed_)) {
          run_attempt(a, attempt->revision, deadline);
          continue;
        }
      }
      if (attempt && attempt->value.state == attempt_state::fenced &&
          std::find(attempt->value.receivers.begin(), attempt->value.receivers.end(), name_) !=
              attempt->value.receivers.end() &&
          !acked(attempt->value.key)) {
        // Fenced before this receiver started it: nothing of it was written here; say so, so
        // that the coordinator need not wait for this receiver's lease to expire.
        acked_.push_back(attempt->value.key);
        receiver_ack fenced_ack;
        fenced_ack.name = name_;
        fenced_ack.incarnation = incarnation_;
        fenced_ack.state = ack_state::fenced;
        with_retry("receiver agent: acknowledge fence", deadline, [&] {
          put(*plane_, keys.ack(attempt->value.key, name_), encode_record(fenced_ack));
          return 0;
        });
        continue;
      }
      DCR_EXPECTS(protocol_clock::now() < deadline, errc::deadline_exceeded,
                  "receiver '" + name_ + "': version " + std::to_string(version) +
                      " not reached by the deadline (holds " + std::to_string(committed_) + ")");
      with_retry("receiver agent: wait", deadline, [&] {
        return plane_->wait_for_change(keys.all(), seen,
                                       std::min(deadline, protocol_clock::now() + std::chrono::seconds(1)));
      });
    }
  }

  [[nodiscard]] std::uint64_t committed_version() const noexcept { return committed_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::string& incarnation() const noexcept { return incarnation_; }
  /// The acknowledgement of the last attempt this agent took part in.
  [[nodiscard]] const receiver_ack& last_ack() const noexcept { return ack_; }
  /// Payloads refused as stale (of a fenced attempt) since construction.
  [[nodiscard]] std::uint64_t stale_refused() const noexcept { return stale_total_; }
  /// One span per payload applied in the last attempt (unix seconds).
  [[nodiscard]] const std::vector<stage_span>& last_timeline() const noexcept { return timeline_; }
  /// Restores applied since construction.
  [[nodiscard]] std::uint64_t restores() const noexcept { return restores_; }

 private:
  using clock = protocol_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  void register_self() {
    receiver_registration reg;
    reg.name = name_;
    reg.incarnation = incarnation_;
    const auto only = rx_->overwrite_only_tensors();
    reg.overwrite_only.assign(only.begin(), only.end());
    reg.committed_version = committed_;
    reg.restored = restored_ && !dirty_;
    reg.registry_fingerprint = fingerprint_;
    put(*plane_, options_.keys.receiver(name_), encode_record(reg), lease_);
  }

  bool acked(const attempt_key& key) const {
    return std::find(acked_.begin(), acked_.end(), key) != acked_.end();
  }

  // Applies one delivery; a validation failure gets one fresh copy (a failure after the writes
  // began is not retried: the receiver refuses the rest of the attempt, see
  // receiver_endpoint::apply_payload). Stale payloads (another attempt's) are refused and
  // counted, never applied.
  void apply_one(delivery& d) {
    const double a0 = unix_seconds_now();
    struct span_guard {
      std::vector<stage_span>* out;
      double begin;
      ~span_guard() { out->push_back({"apply", begin, unix_seconds_now()}); }
    } guard{&timeline_, a0};
    try {
      rx_->apply_payload(d.bytes);
    } catch (const error& e) {
      if (e.dcr_code() == errc::stale_payload) {
        ++ack_.stale;
        ++stale_total_;
        return;
      }
      if (!source_->refetch(d.id, d.bytes)) throw;
      ++ack_.refetched;
      rx_->apply_payload(d.bytes);  // a second failure fails the attempt
    }
    ++applied_count_;
    if (options_.after_apply) options_.after_apply(current_, applied_count_);
  }

  void run_attempt(const attempt_record& a, std::int64_t attempt_revision,
                   protocol_clock::time_point deadline) {
    const attempt_key key = a.key;
    acked_.push_back(key);
    current_ = a;
    applied_count_ = 0;
    timeline_.clear();
    ack_ = {};
    ack_.name = name_;
    ack_.incarnation = incarnation_;
    const auto t0 = clock::now();
    const bool restore = a.kind == attempt_kind::restore;
    const auto attempt_deadline =
        std::min(deadline, clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(
                                              0, a.deadline_unix_ms - unix_ms_now())));

    // Fence watcher: the attempt record leaving `open` (or being replaced) stops the apply
    // between payloads. One control-plane wait per protocol change, never per payload. It
    // watches the whole protocol prefix, so that this receiver's own acknowledgement wakes it
    // and it stops as soon as the attempt is over here (never a poll interval later).
    std::atomic<bool> fenced{false}, done{false};
    std::thread watcher([&] {
      std::int64_t rev = attempt_revision;
      while (!done.load()) {
        try {
          rev = plane_->wait_for_change(options_.keys.all(), rev,
                                        clock::now() + std::chrono::milliseconds(500));
          if (done.load()) return;
          auto r = plane_->get(options_.keys.attempt());
          if (!r || r->revision != attempt_revision) {
            fenced = true;
            return;
          }
        } catch (const error&) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    });

    // Stops the watcher however this function is left; normally the acknowledgement written
    // at the end has already woken it.
    struct watcher_stop {
      std::atomic<bool>* done;
      std::thread* watcher;
      ~watcher_stop() {
        done->store(true);
        if (watcher->joinable()) watcher->join();
      }
    } stop_watcher{&done, &watcher};

    rx_->begin_attempt(key);
    source_->open(key, a.owners);
    if (!restore) dirty_ = true;
    std::string failure;
    double fetch = 0;
    try {
      if (!restore && !options_.asynchronous && !gate_closed_) close_gate();
      pipeline_stage<delivery> stage(options_.queue_depth, [&](delivery& d) { apply_one(d); });
      std::vector<delivery> staged;  // asynchronous mode: compressed payloads in host memory
      for (;;) {
        if (stop_ != nullptr && stop_->load())
          throw error(errc::not_ready, "receiver agent: stopped");
        if (fenced.load()) break;
        delivery d;
        const auto f0 = clock::now();
        const auto status =
            source_->next(d, std::min(attempt_deadline, clock::now() + std::chrono::milliseconds(100)));
        fetch += seconds(clock::now() - f0);
        if (status == source_status::complete) break;
        if (status == source_status::timed_out) {
          DCR_EXPECTS(clock::now() < attempt_deadline, errc::deadline_exceeded,
                      "receiver '" + name_ + "': attempt " + to_string(key) +
                          " not delivered by its deadline");
          continue;
        }
        ++ack_.payloads;
        ack_.payload_bytes += d.bytes.size();
        if (options_.asynchronous && !restore)
          staged.push_back(std::move(d));
        else
          stage.submit(std::move(d));
      }
      if (options_.asynchronous && !restore && !fenced.load()) {
        close_gate();  // every payload is here: the engine pauses only for the apply
        for (auto& d : staged) {
          if (fenced.load()) break;
          stage.submit(std::move(d));
        }
      }
      stage.drain();
      ack_.apply_seconds = stage.busy_seconds();
    } catch (const error& e) {
      failure = std::string("receiver '") + name_ + "': " + e.what();
    }
    done = true;
    // Nothing more of this attempt is taken here, whatever happened: a push transport answers
    // its senders for whatever this receiver did not take.
    if constexpr (closable_source<Source>) source_->close(key);
    ack_.duplicates = rx_->stats().duplicates_dropped;
    ack_.applied_payloads = rx_->stats().attempt_payloads;
    ack_.applied_payload_digest = rx_->stats().attempt_payload_digest;
    ack_.fetch_seconds = fetch;
    ack_.seconds = seconds(clock::now() - t0);
    ack_.peak_rss_bytes = peak_rss_bytes();
    if (!failure.empty()) {
      ack_.state = ack_state::failed;
      ack_.failure = failure;
    } else if (fenced.load()) {
      ack_.state = ack_state::fenced;
    } else {
      ack_.state = restore ? ack_state::restored : ack_state::applied;
    }
    if (restore && ack_.state == ack_state::restored) {
      committed_ = a.key.base_version;
      restored_ = true;
      dirty_ = false;
      ++restores_;
      rx_->end_transition(committed_);
    }
    if (!restore && ack_.state == ack_state::applied) {
      applied_ = true;
      applied_key_ = key;
    }
    with_retry("receiver agent: acknowledge", deadline, [&] {
      if (restore) register_self();  // restored first: the coordinator reads the ack after it
      put(*plane_, options_.keys.ack(key, name_), encode_record(ack_));
      return 0;
    });
  }

  void close_gate() {
    if (gate_closed_) return;
    if (gate_.close) gate_.close();
    gate_closed_ = true;
  }

  std::string name_;
  receiver_endpoint* rx_;
  std::uint64_t fingerprint_;
  Plane* plane_;
  Source* source_;
  receiver_agent_options options_;
  request_gate gate_;
  std::string incarnation_;
  lease_id lease_ = 0;
  std::unique_ptr<lease_keeper<Plane>> keeper_;
  std::uint64_t committed_ = 0;
  bool restored_ = false;
  bool dirty_ = false;        // holds writes of an uncommitted attempt
  bool applied_ = false;      // applied applied_key_, waiting for its commit
  attempt_key applied_key_{};
  bool gate_closed_ = false;
  std::vector<attempt_key> acked_;
  attempt_record current_;
  std::uint64_t applied_count_ = 0;
  receiver_ack ack_;
  std::uint64_t stale_total_ = 0;
  std::uint64_t restores_ = 0;
  const std::atomic<bool>* stop_ = nullptr;
  std::vector<stage_span> timeline_;
};

}  // namespace dcr
