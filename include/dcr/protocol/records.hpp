// dcr/protocol/records.hpp: the records the agents agree through, their keys under a prefix,
// and their JSON form (what an etcd client or `cat` of the file store shows).
//
// Keys under PREFIX (default "/dcr"):
//   PREFIX/commit                       commit_record: the committed version (joint commit)
//   PREFIX/history/<version>            commit_record of each committed version, written by the
//                                       same transaction as the commit and only if absent, so
//                                       that no version can ever be committed twice
//   PREFIX/attempt                      attempt_record: the current attempt (the fence)
//   PREFIX/membership                   membership_record: receivers an attempt requires
//   PREFIX/receivers/<name>             receiver_registration, under the receiver's lease
//   PREFIX/owners/<id>                  owner_registration, under the owner agent's lease
//   PREFIX/reports/<attempt>/<id>       owner_report: an owner built (or failed) an attempt
//   PREFIX/acks/<attempt>/<name>        receiver_ack: fenced, applied, restored or failed
// where <attempt> is to_string(attempt_key): "t<base>-<target>-a<number>", e.g. t3-4-a1. Per
// transition the agents write O(owners + receivers) records, never one per payload.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dcr/codec/choose.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/error.hpp"
#include "dcr/refit/owner_stats.hpp"

namespace dcr {

/// The joint commit record: which version every receiver holds and the owners track.
struct commit_record {
  std::uint64_t version = 0;               ///< committed policy version
  std::uint32_t attempt = 0;               ///< attempt of the transition that produced it
  std::uint64_t registry_fingerprint = 0;  ///< model the version belongs to
  std::uint64_t membership_epoch = 0;      ///< membership the attempt required
  std::uint64_t manifest_digest = 0;       ///< digest of the attempt's owner manifests
  std::string candidate;                   ///< the candidate weights it binds (e.g. "step 7")
  /// Incarnation of the coordinator whose commit transaction wrote it (empty in the record
  /// initialize() writes): how a coordinator whose answer was lost recognises its own commit.
  std::string coordinator;
  friend bool operator==(const commit_record&, const commit_record&) = default;
};

/// Where an attempt stands.
enum class attempt_state : std::uint8_t {
  open,       ///< owners build, receivers apply
  fenced,     ///< failed: no write of it may land any more (receivers acknowledge the fence)
  committed,  ///< the joint commit bound it
};

/// What an attempt does.
enum class attempt_kind : std::uint8_t {
  refit,    ///< the transition base -> base + 1
  restore,  ///< base -> base: a dense overwrite of the committed version for joining receivers
};

/// The attempt record (the fence): receivers accept payloads of this attempt only.
struct attempt_record {
  attempt_kind kind = attempt_kind::refit;
  attempt_key key;                       ///< the attempt: its transition and number
  encoding_policy policy = encoding_policy::mixed;
  std::vector<std::uint32_t> owners;     ///< owners that must put a manifest
  std::vector<std::string> receivers;    ///< receivers that must acknowledge
  std::vector<tensor_id> overwrite_only; ///< union of the required receivers' overwrite-only
  std::string candidate;                 ///< identity of the candidate weights (a trainer step)
  /// Per owner, the digest of the changed set it built in an earlier attempt of this
  /// transition (a restarted owner compares its own against it).
  std::map<std::uint32_t, std::uint64_t> candidate_digests;
  std::int64_t deadline_unix_ms = 0;     ///< the coordinator fails the attempt after this
  std::uint64_t membership_epoch = 0;
  /// Refit attempts of this transition prepared before this record: only a transition's very
  /// first refit attempt may use a delta encoding (receivers may hold partial writes after).
  std::uint32_t refits_before = 0;
  attempt_state state = attempt_state::open;
};

/// Which receivers the deployment's attempts require.
struct membership_record {
  std::uint64_t epoch = 0;
  /// name -> incarnation of the registration that joined (a restarted receiver has a new one).
  std::map<std::string, std::string> receivers;
};

/// A receiver agent's registration (under its lease).
struct receiver_registration {
  std::string name;
  std::string incarnation;                ///< unique per process start
  std::vector<tensor_id> overwrite_only;  ///< from prewarm
  std::uint64_t committed_version = 0;    ///< the version its storage holds
  bool restored = false;                  ///< storage holds committed_version (dense or refit)
  std::uint64_t registry_fingerprint = 0;
};

/// An owner agent's registration (under its lease).
struct owner_registration {
  std::uint32_t owner = 0;
  std::string incarnation;
  std::uint64_t tracker_version = 0;  ///< the version its trackers hold
  /// The candidate weights it holds and serves ("" until it serves a transition): the
  /// coordinator opens an attempt only once every owner holds the attempt's candidate.
  std::string candidate;
};

/// An owner's account of one attempt.
struct owner_report {
  std::uint32_t owner = 0;
  std::string incarnation;
  bool built = false;            ///< its payloads and manifest are in the payload store
  std::string failure;           ///< why not, when !built
  std::uint64_t change_digest = 0;  ///< digest of the changed set (identity of the candidates)
  std::uint64_t manifest_digest = 0;
  /// The set digest of its manifest's payload ids (payload_id_digest summed); `payloads` is
  /// their count.
  std::uint64_t payload_set_digest = 0;
  std::uint64_t payloads = 0, payload_bytes = 0, records = 0;
  owner_stats stats;             ///< the owner's figures of the attempt (dcr::owner::stats())
  double build_seconds = 0;      ///< detect, project, convert, encode (calling thread; wall
                                 ///< time of the build phase with build_threads > 1)
  double compress_seconds = 0;   ///< pack + zstd (second thread; with build_threads > 1 the
                                 ///< wall time of the threads' compression phase)
  double put_seconds = 0;        ///< payload store puts
  double seconds = 0;            ///< attempt seen to manifest put
  std::uint64_t peak_rss_bytes = 0;
};

/// What a receiver did with an attempt.
enum class ack_state : std::uint8_t { applied, restored, fenced, failed };

/// A receiver's acknowledgement of one attempt.
struct receiver_ack {
  std::string name;
  std::string incarnation;
  ack_state state = ack_state::applied;
  std::string failure;
  std::uint64_t payloads = 0, payload_bytes = 0, duplicates = 0, refetched = 0, stale = 0;
  /// The distinct payloads of the attempt it applied, and their set digest: the coordinator
  /// commits only when every receiver applied exactly the payloads the owners' manifests list.
  std::uint64_t applied_payloads = 0, applied_payload_digest = 0;
  double fetch_seconds = 0, apply_seconds = 0, seconds = 0;
  std::uint64_t peak_rss_bytes = 0;
};

// ---- keys

/// The keys of one deployment, under `prefix`.
struct protocol_keys {
  std::string prefix = "/dcr";
  [[nodiscard]] std::string commit() const { return prefix + "/commit"; }
  [[nodiscard]] std::string history(std::uint64_t v) const;
  [[nodiscard]] std::string history_prefix() const { return prefix + "/history/"; }
  [[nodiscard]] std::string attempt() const { return prefix + "/attempt"; }
  [[nodiscard]] std::string membership() const { return prefix + "/membership"; }
  [[nodiscard]] std::string receivers() const { return prefix + "/receivers/"; }
  [[nodiscard]] std::string receiver(const std::string& name) const { return receivers() + name; }
  [[nodiscard]] std::string owners() const { return prefix + "/owners/"; }
  [[nodiscard]] std::string owner(std::uint32_t id) const { return owners() + std::to_string(id); }
  [[nodiscard]] std::string reports(const attempt_key& k) const;
  [[nodiscard]] std::string report(const attempt_key& k, std::uint32_t owner) const;
  [[nodiscard]] std::string acks(const attempt_key& k) const;
  [[nodiscard]] std::string ack(const attempt_key& k, const std::string& name) const;
  /// Everything under the prefix (a waiter that cares about any protocol change).
  [[nodiscard]] std::string all() const { return prefix + "/"; }
};

// ---- JSON

NLOHMANN_JSON_SERIALIZE_ENUM(attempt_state, {{attempt_state::open, "open"},
                                             {attempt_state::fenced, "fenced"},
                                             {attempt_state::committed, "committed"}})
NLOHMANN_JSON_SERIALIZE_ENUM(attempt_kind, {{attempt_kind::refit, "refit"},
                                            {attempt_kind::restore, "restore"}})
NLOHMANN_JSON_SERIALIZE_ENUM(ack_state, {{ack_state::applied, "applied"},
                                         {ack_state::restored, "restored"},
                                         {ack_state::fenced, "fenced"},
                                         {ack_state::failed, "failed"}})
NLOHMANN_JSON_SERIALIZE_ENUM(encoding_policy, {{encoding_policy::mixed, "mixed"},
                                               {encoding_policy::overwrite_only, "overwrite"},
                                               {encoding_policy::xor_only, "xor"},
                                               {encoding_policy::ulp_only, "ulp"}})

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(commit_record, version, attempt,
                                                registry_fingerprint, membership_epoch,
                                                manifest_digest, candidate, coordinator)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(attempt_key, base_version, target_version, number)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(attempt_record, kind, key, policy, owners,
                                                receivers, overwrite_only, candidate,
                                                candidate_digests, deadline_unix_ms,
                                                membership_epoch, refits_before, state)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(membership_record, epoch, receivers)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(receiver_registration, name, incarnation,
                                                overwrite_only, committed_version, restored,
                                                registry_fingerprint)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(owner_registration, owner, incarnation,
                                                tracker_version, candidate)
// owner_stats as a JSON object of its DCR_OWNER_STATS_FIELDS (missing members read as 0).
inline void to_json(nlohmann::json& j, const owner_stats& s) {
  j = nlohmann::json::object();
#define DCR_OWNER_STATS_TO_JSON(type, name) j[#name] = s.name;
  DCR_OWNER_STATS_FIELDS(DCR_OWNER_STATS_TO_JSON)
#undef DCR_OWNER_STATS_TO_JSON
}
inline void from_json(const nlohmann::json& j, owner_stats& s) {
  s = {};
#define DCR_OWNER_STATS_FROM_JSON(type, name) s.name = j.value(#name, s.name);
  DCR_OWNER_STATS_FIELDS(DCR_OWNER_STATS_FROM_JSON)
#undef DCR_OWNER_STATS_FROM_JSON
}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(owner_report, owner, incarnation, built, failure,
                                                change_digest, manifest_digest,
                                                payload_set_digest, payloads, payload_bytes,
                                                records, stats, build_seconds,
                                                compress_seconds, put_seconds, seconds,
                                                peak_rss_bytes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(receiver_ack, name, incarnation, state, failure,
                                                payloads, payload_bytes, duplicates, refetched,
                                                stale, applied_payloads, applied_payload_digest,
                                                fetch_seconds, apply_seconds, seconds,
                                                peak_rss_bytes)

/// The JSON text of a record.
template <class Record>
std::string encode_record(const Record& r) {
  return nlohmann::json(r).dump();
}

/// Parses a record; a damaged one throws errc::corrupt_payload naming `key`.
template <class Record>
Record decode_record(const std::string& key, const std::string& text) {
  try {
    return nlohmann::json::parse(text).get<Record>();
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload,
                "control plane record '" + key + "' is damaged: " + e.what());
  }
}

}  // namespace dcr

#include "dcr/detail/protocol/records.inl"
