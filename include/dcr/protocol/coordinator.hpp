// dcr/protocol/coordinator.hpp: the coordinator: membership, attempts, fencing, the joint
// commit and cleanup, through the control plane only.
//
// One transition v -> v+1 (docs/protocol.md draws the state machine):
//   prepare   membership between attempts: members whose registration vanished (lease expired)
//             or changed incarnation (restarted) leave; receivers that registered without
//             holding v are restored first (a restore attempt v -> v: owners put a dense
//             overwrite of their trackers, the joiners apply it and acknowledge `restored`);
//             then the attempt record is written by compare-and-set: transition, attempt number,
//             policy (attempt 0 the configured one, every retry overwrite-only), expected owners,
//             required receivers, the union of their overwrite-only tensors, the candidate and
//             the change digests owners reported for it in earlier attempts, a deadline
//   deliver   owners build and put, receivers apply; the coordinator only watches the reports
//             and acknowledgements (one record per agent per attempt)
//   commit    when every owner reported `built` and every required receiver acknowledged
//             `applied`: one transaction that holds only if the commit record still says v, the
//             attempt record is still this open attempt, and no history record of v+1 exists;
//             it writes the commit record, the attempt's `committed` state and history/v+1
//   fence     on a failure (a report or acknowledgement says failed, an agent's lease expired or
//             its incarnation changed, the deadline passed): the attempt record goes to
//             `fenced` and the coordinator waits until every required receiver acknowledged
//             (any state: none of them writes that attempt any more) or left the membership;
//             then the next attempt starts from prepare
// A coordinator that starts while an attempt of v -> v+1 is open continues it (it may commit
// what its dead predecessor prepared); two racing coordinators both watch the same records and
// at most one commit transaction can succeed.
#pragma once

#include <xxhash.h>

#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcr/protocol/agent_support.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace dcr {

struct coordinator_options {
  protocol_keys keys{};
  encoding_policy policy = encoding_policy::mixed;  ///< attempt 0; retries overwrite only
  std::uint32_t max_attempts = 5;                   ///< refit attempts per run_transition call
  std::chrono::milliseconds attempt_timeout{120000};
  /// Before the first attempt, wait until this many receivers registered (a deployment
  /// starting up); later attempts go on with whoever is a member.
  std::size_t min_receivers = 0;
  /// Erase the payloads of a transition once it committed (they are obsolete). False keeps them
  /// for inspection until a later commit erases them.
  bool erase_after_commit = true;
  /// Test hook, called with every required acknowledgement in, just before the commit
  /// transaction; the simulate tool kills the process here for `--kill coordinator:STEP`.
  std::function<void(const attempt_record&)> before_commit;
};

/// One attempt as the coordinator saw it.
struct attempt_summary {
  attempt_key key;
  attempt_kind kind = attempt_kind::refit;
  encoding_policy policy = encoding_policy::mixed;
  bool committed = false;
  std::string failure;
  std::vector<owner_report> reports;
  std::vector<receiver_ack> acks;
  std::map<std::uint32_t, std::string> owner_incarnations;  ///< registered when it was opened
  double seconds = 0;  ///< attempt record written to outcome
};

struct transition_summary {
  std::uint64_t base_version = 0, target_version = 0;
  bool committed = false;
  /// Another coordinator's commit transaction won (false when this coordinator's own commit
  /// applied, even if its answer was lost and only a retry found it).
  bool committed_by_other = false;
  std::vector<attempt_summary> attempts;  ///< restores included
  std::uint64_t restores = 0;
  double seconds = 0;        ///< prepare (the first attempt record written) to commit
  double commit_seconds = 0; ///< the commit transaction
  double cleanup_seconds = 0;  ///< after the commit: the transition's payloads erased
  /// Before the first attempt record: waiting for every owner to hold the candidate (the
  /// trainer's step) and for the first receivers to register. Not part of `seconds`.
  double wait_seconds = 0;
};

template <control_plane Plane, payload_cleanup Store>
class coordinator {
 public:
  /// `owners`: the owner ids every refit attempt expects. The plane and store must outlive it;
  /// the store is only erased from after commits (nothing_to_erase for a push transport).
  coordinator(Plane& plane, Store& store, std::uint64_t registry_fingerprint,
              std::vector<std::uint32_t> owners, coordinator_options options = {});

  /// Creates the commit record at `version` and an empty membership if there are none (the
  /// first start of a deployment); refuses a commit record of another model.
  void initialize(std::uint64_t version, protocol_clock::time_point deadline);

  /// Runs the transition from the committed version v to v+1 for `candidate` (continuing an
  /// open attempt of it if there is one) until it commits, max_attempts refit attempts fail,
  /// or `deadline`. Throws deadline_exceeded at the deadline (nothing is committed then).
  transition_summary run_transition(const std::string& candidate,
                                    protocol_clock::time_point deadline);

  [[nodiscard]] const coordinator_options& options() const noexcept { return options_; }

  /// A name unique to this coordinator object (host, pid, random); its commit records carry it
  /// (commit_record::coordinator).
  [[nodiscard]] const std::string& incarnation() const noexcept { return incarnation_; }

 private:
  // committed: this coordinator's transaction applied (also when its answer was lost and the
  // retry found the record it wrote); by_other: another coordinator's transaction committed
  // the same attempt; lost: something else was committed.
  enum class commit_result { committed, by_other, lost };

  // The commit record, which must still hold version v: another coordinator committing during
  // this one's transition is a commit_conflict, never a second commit.
  typed_record<commit_record> expect_version_unmoved(std::uint64_t v,
                                                     protocol_clock::time_point deadline);

  template <class R>
  typed_record<R> must_read(const std::string& key, protocol_clock::time_point deadline) {
    auto r = with_retry("coordinator: read", deadline, [&] { return read_record<R>(*plane_, key); });
    DCR_EXPECTS(r.has_value(), errc::not_ready,
                "coordinator: no record under '" + key + "' (initialize the deployment first)");
    return *r;
  }

  // The live registrations by name.
  std::map<std::string, receiver_registration> live_receivers(protocol_clock::time_point deadline);
  std::map<std::uint32_t, owner_registration> live_owners(protocol_clock::time_point deadline);

  // Membership between attempts; writes the next attempt record (a restore if a receiver must
  // join first). Returns the open attempt, or nullopt if the caller should look again.
  std::optional<typed_record<attempt_record>> prepare(
      std::uint64_t v, const std::string& candidate,
      const std::optional<typed_record<attempt_record>>& previous,
      protocol_clock::time_point deadline, transition_summary& out);

  // prepare(), step by step:
  // (1) waits until every expected owner is registered at v holding `candidate`;
  void wait_for_owners(std::uint64_t v, const std::string& candidate,
                       protocol_clock::time_point deadline);
  // the live receiver registrations, and the store revision taken just before reading them
  // (a wait from it wakes on any change after that);
  struct receivers_seen {
    std::int64_t revision = 0;
    std::map<std::string, receiver_registration> regs;
  };
  receivers_seen look_at_receivers(protocol_clock::time_point deadline);
  // (2) before this coordinator's first attempt: waits until min_receivers registered;
  void wait_for_first_receivers(receivers_seen& seen, protocol_clock::time_point deadline);
  // (3) waits, bounded by attempt_timeout, for members that applied v but have not yet
  // re-registered at it (so that they are not dropped into a needless restore);
  void wait_for_lagging_members(std::uint64_t v, const membership_record& membership,
                                receivers_seen& seen, protocol_clock::time_point deadline);
  // (4) the membership of the next attempt: members still registered with their incarnation at
  // v, plus newcomers that already hold v; the other newcomers go to `joiners` (restored first);
  membership_record next_membership(std::uint64_t v, const membership_record& membership,
                                    const std::map<std::string, receiver_registration>& regs,
                                    std::vector<std::string>& joiners) const;
  // (5) after the membership record is written: the next attempt record, a restore v -> v of
  // `joiners` if there are any, else the refit v -> v+1 of the members (policy, overwrite-only
  // union, numbering and the change digests of earlier attempts); (6) prepare writes it.
  attempt_record next_attempt(std::uint64_t v, const std::string& candidate,
                              const std::optional<typed_record<attempt_record>>& previous,
                              const membership_record& next,
                              const std::vector<std::string>& joiners,
                              const std::map<std::string, receiver_registration>& regs,
                              protocol_clock::time_point deadline);

  // Watches the attempt until it can commit (failure empty) or has failed.
  attempt_summary watch(const typed_record<attempt_record>& open,
                        protocol_clock::time_point deadline);

  commit_result commit_attempt(const typed_record<commit_record>& base,
                               const typed_record<attempt_record>& open,
                               const attempt_summary& s, protocol_clock::time_point deadline);

  // A restore succeeded: its receivers become members (they hold v now).
  void complete_restore(const attempt_record& a, const attempt_summary& s,
                        protocol_clock::time_point deadline);

  // Fences an attempt and waits until none of its receivers can still write it.
  // Fences an open attempt and waits until its writes can no longer land: every required
  // receiver acknowledged the fence or left, and (with `watched`, the attempt as watch() saw
  // it) every owner reported or left, so no payload of the attempt is still being put; the
  // owners' final reports then complete `watched`.
  void fence(const typed_record<attempt_record>& open, protocol_clock::time_point deadline,
             attempt_summary* watched = nullptr);

  // After the commit of `version`: payloads and per-attempt records of that transition and
  // earlier ones are obsolete.
  void cleanup(std::uint64_t version, protocol_clock::time_point deadline);

  Plane* plane_;
  Store* store_;
  std::uint64_t fingerprint_;
  std::vector<std::uint32_t> owners_;
  coordinator_options options_;
  std::string incarnation_ = make_incarnation();
  bool started_ = false;  // min_receivers was met once
  // When prepare first saw a member still registered at the previous version (see prepare).
  std::optional<protocol_clock::time_point> lagging_since_;
  std::set<std::string> dead_;  // incarnations seen leaving: never required again
};

}  // namespace dcr

#include "dcr/detail/protocol/coordinator.inl"
