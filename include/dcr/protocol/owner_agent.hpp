// dcr/protocol/owner_agent.hpp: the trainer side of the protocol for one owner, in the owner's
// own process: it follows the attempt records, builds and puts the payloads of every attempt
// the coordinator opens (pipelined), reports, and updates the trackers after the joint commit.
// It puts into any payload_sink (a pull store, or the owner end of a push transport, which is
// told each attempt first: attempt_routed_sink).
//
// States of one transition v -> v+1 (docs/protocol.md has the whole machine):
//   waiting   -> an open refit attempt of v -> v+1 naming this owner's candidate appears
//   building  -> chunks are built on the calling thread (detect, project, convert, encode);
//                a second thread packs, compresses and puts each payload as soon as its chunk
//                is built (at most queue_depth chunks in flight: memory stays bounded). With
//                build_threads N > 1 every chunk is built, then every payload compressed, on N
//                threads (owner::build_payloads), and then the payloads are put in order
//   reported  -> manifest put, owner_report written (built, or failed with the reason)
//   committed -> the commit record says v+1 for this candidate: trackers and residual
//                baselines are updated in place; serve_transition returns
// A retry (attempt a > 0) is built from the same candidates as overwrites of the union of
// every element any attempt of the transition sent. An owner restarted mid-transition
// (initialized from version v) cannot know what its earlier self sent: it compares the digest
// of its changed set with the one the coordinator recorded for it, and sends every element
// (mode dense) if they differ, so a commit never binds a mixture of candidates. Restore
// attempts (receivers joining) are answered with a dense overwrite of the trackers.
#pragma once

#include <algorithm>
#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "dcr/pipeline.hpp"
#include "dcr/protocol/agent_support.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "dcr/refit/owner.hpp"

namespace dcr {

struct owner_agent_options {
  protocol_keys keys{};
  std::size_t bucket_bytes = std::size_t{64} << 20;  ///< raw record bytes per payload (about)
  std::size_t chunk_bytes = std::size_t{64} << 20;   ///< source bytes per pipelined chunk
  codec_options codec{};
  std::size_t queue_depth = 2;    ///< chunks between building and putting
  bool pipelined = true;          ///< false: build everything, then pack and put
  /// Threads that build and compress an attempt (at least 1). 1: the calling thread builds,
  /// pipelined as above. N > 1: owner::build_payloads on N threads with N encoders of `codec`,
  /// then the puts on the calling thread: byte for byte the payloads and ids of the pipelined
  /// one-thread build (also when `pipelined` is false, which then does not apply, nor does
  /// queue_depth), with every payload of the attempt held in memory before the first put. An
  /// owner with a detect backend builds as with 1 (owner::payload_threads).
  std::size_t build_threads = 1;
  std::chrono::seconds lease_ttl{10};
  /// Test hook, called after each payload put (attempt, payloads put so far); the simulate
  /// tool kills the process here for `--kill owner:STEP`.
  std::function<void(const attempt_record&, std::uint64_t)> after_put;
};

template <control_plane Plane, payload_sink Store>
class owner_agent {
 public:
  /// The owner, registry, control plane and store must outlive the agent.
  owner_agent(owner& o, const tensor_registry& registry, Plane& plane, Store& store,
              owner_agent_options options = {});
  ~owner_agent();

  /// Registers the owner (under a lease kept alive by a thread) with trackers at
  /// `tracker_version` (initialize() the owner first). `restarted`: this process replaces one
  /// that died; attempts it finds open and unreported are reported failed at once.
  void start(std::uint64_t tracker_version, protocol_clock::time_point deadline,
             bool restarted = false);

  /// Serves the transition tracker_version -> tracker_version + 1 for `candidate` (the
  /// identity of the candidate weights, e.g. "step 7"; candidates/residual_inputs as for
  /// owner::build_items) until the coordinator commits it, then updates the trackers and
  /// returns the commit record. Throws deadline_exceeded at `deadline`, commit_conflict if the
  /// deployment committed past this owner's trackers with other candidates.
  commit_record serve_transition(const std::string& candidate,
                                 std::span<const std::span<const std::byte>> candidates,
                                 std::span<const std::span<const std::byte>> residual_inputs,
                                 protocol_clock::time_point deadline,
                                 const std::atomic<bool>* stop = nullptr);

  [[nodiscard]] std::uint64_t tracker_version() const noexcept { return tracker_version_; }
  [[nodiscard]] const std::string& incarnation() const noexcept { return incarnation_; }
  /// The report of the last attempt this agent built.
  [[nodiscard]] const owner_report& last_report() const noexcept { return report_; }
  /// The stage timeline of the last attempt this agent built.
  [[nodiscard]] const std::vector<stage_span>& last_timeline() const noexcept { return timeline_; }
  [[nodiscard]] const owner_agent_options& options() const noexcept { return options_; }
  /// Payload size and codec for the attempts built from now on.
  void set_codec(std::size_t bucket_bytes, const codec_options& codec);

 private:
  using clock = protocol_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // The lease expired (an outage longer than its ttl): the coordinator saw this owner leave, so
  // it comes back as a new incarnation with a new lease (its trackers are intact).
  void reregister(protocol_clock::time_point deadline);

  owner_registration registration() const;

  bool handled(const attempt_key& key) const;

  void write_report(const attempt_key& key, protocol_clock::time_point deadline);

  void handle_attempt(const attempt_record& a, const std::string& candidate,
                      std::span<const std::span<const std::byte>> candidates,
                      std::span<const std::span<const std::byte>> residual_inputs,
                      protocol_clock::time_point deadline);

  // Builds every chunk and puts its payloads (on the stage thread when pipelined, after
  // owner::build_payloads with build_threads > 1), then the manifest. Fills report_ and
  // timeline_.
  void build_and_put(const attempt_record& a, std::span<const std::span<const std::byte>> sources,
                     std::span<const std::span<const std::byte>> residual_inputs, build_mode mode,
                     encoding_policy policy, protocol_clock::time_point /*deadline*/);

  owner* owner_;
  const tensor_registry* registry_;
  Plane* plane_;
  Store* store_;
  owner_agent_options options_;
  std::string incarnation_;
  std::string candidate_;  // the candidate weights served (registered with the owner)
  std::vector<payload_encoder> encoders_;  // build_threads of them, equal options (codec)
  lease_id lease_ = 0;
  std::unique_ptr<lease_keeper<Plane>> keeper_;
  std::uint64_t tracker_version_ = 0;
  bool restarted_ = false;
  std::optional<attempt_key> died_in_;
  bool built_in_process_ = false;
  std::vector<attempt_key> handled_;
  owner_report report_;
  std::vector<stage_span> timeline_;
  std::vector<std::vector<std::byte>> payloads_;
  std::vector<payload_id> payload_ids_;  // payload_ids_[k]: the id of payloads_[k]
  std::vector<payload_id> ids_;
  std::vector<std::span<const std::byte>> restore_spans_, restore_inputs_;
};

}  // namespace dcr

#include "dcr/detail/protocol/owner_agent.inl"
