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
  ~receiver_agent();

  /// Registers. `restored`: the storage already holds `committed_version` (a dense load from
  /// its checkpoint); otherwise the coordinator restores it before it joins.
  void start(std::uint64_t committed_version, bool restored, protocol_clock::time_point deadline);

  /// Serves attempts until the commit record reaches `version` and this receiver holds it;
  /// returns the committed version. Throws deadline_exceeded at `deadline`.
  std::uint64_t serve_until(std::uint64_t version, protocol_clock::time_point deadline,
                            const std::atomic<bool>* stop = nullptr);

  /// The version this receiver's storage holds (its receiver_endpoint keeps it: the one place
  /// of that fact; the agent only reads it).
  [[nodiscard]] std::uint64_t committed_version() const noexcept {
    return rx_->committed_version();
  }
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

  void register_self();

  bool acked(const attempt_key& key) const;

  // Applies one delivery; a validation failure gets one fresh copy (a failure after the writes
  // began is not retried: the receiver refuses the rest of the attempt, see
  // receiver_endpoint::apply_payload). Stale payloads (another attempt's) are refused and
  // counted, never applied.
  void apply_one(delivery& d);

  void run_attempt(const attempt_record& a, std::int64_t attempt_revision,
                   protocol_clock::time_point deadline);

  // run_attempt(), step by step:
  // the attempt record's fence, watched from a thread of its own;
  class fence_watcher;
  // (1) resets the per-attempt state and starts the acknowledgement of `a`;
  void begin_ack(const attempt_record& a);
  // (2) fetches and applies the payloads of `a` (asynchronous mode: stages them all, then
  // closes the gate and applies) until the source completes, the attempt is fenced, or a
  // failure, which it returns ("" if none); adds the time spent fetching to `fetch_seconds`;
  std::string deliver(const attempt_record& a, protocol_clock::time_point attempt_deadline,
                      const std::atomic<bool>& fenced, double& fetch_seconds);
  // (3) completes the acknowledgement (counters, state) and what this receiver holds after it
  // (a restore: version v; an applied refit: waiting for its commit);
  void settle_ack(const attempt_record& a, const std::string& failure, bool fenced,
                  clock::time_point t0, double fetch);
  // (4) writes it (for a restore, after the registration that says restored).
  void acknowledge(const attempt_record& a, protocol_clock::time_point deadline);

  void close_gate();

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

#include "dcr/detail/protocol/receiver_agent.inl"
