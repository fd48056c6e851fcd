// dcr/refit/coordinator.hpp: one transition v -> v+1, end to end: attempts, delivery, joint
// commit, tracker update, and overwrite retries.
//
// run_transition drives every owner and receiver of an in-process deployment (the shape of
// `dcr simulate` and of the tests; a distributed deployment runs the same steps on different
// machines, talking through the same transport and commit store):
//   1. the commit record must say `base_version` (else commit_conflict: someone else moved on);
//   2. the owners learn which tensors some receiver takes only as overwrites (the union of the
//      receivers' overwrite_only_tensors(), gathered once per transition);
//   3. attempt a: owners build items from their affine and residual tasks (attempt 0 with the
//      configured policy, retries overwrite-only), pack and publish payloads, and publish their
//      manifests;
//   4. every receiver is moved to attempt a (fencing earlier attempts), fetches every payload
//      the manifest lists, and applies it; a payload that fails validation is fetched once
//      more (a corrupted download), and a receiver that still fails fails the attempt;
//   5. if every receiver applied everything, the coordinator commits v+1 by compare-and-set;
//      owners then update their trackers and residual baselines in place and receivers end the
//      transition;
//   6. otherwise the next attempt re-sends the complete changed set from the same candidates
//      as overwrites, which repairs any partial writes, up to max_attempts.
// A transition that an earlier call left uncommitted (its attempts still listed in the
// transport) is continued, not restarted: the first attempt of this call takes the next attempt
// number and is overwrite-only, because receivers may hold partial writes of the earlier
// attempts and their payload ids (and dedupe entries) must not be reused.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/commit/concept.hpp"
#include "dcr/refit/owner.hpp"
#include "dcr/refit/receiver.hpp"
#include "dcr/transport/concept.hpp"

namespace dcr {

struct refit_options {
  encoding_policy policy = encoding_policy::mixed;  ///< first attempt; retries overwrite only
  std::size_t bucket_bytes = std::size_t{64} << 20;  ///< raw record bytes per payload (about)
  codec_options codec{};
  std::uint32_t max_attempts = 3;  ///< attempts this call may make
};

/// What a fault plan may do to one delivery (tests and `dcr simulate --fault`).
enum class delivery_action {
  deliver,        ///< apply as fetched
  deliver_twice,  ///< apply, then deliver the same bytes again (must be dropped as duplicate)
  corrupt,        ///< flip one byte of the fetched copy (must be refused, then re-fetched)
  fail_receiver,  ///< the receiver drops out of this attempt here (its earlier writes stay)
};

/// Called before each delivery: (attempt, receiver index, payload ordinal in the manifest).
using fault_plan = std::function<delivery_action(std::uint32_t, std::size_t, std::size_t)>;

/// An owner and the candidate shards of its tasks for this transition: candidates[i] for
/// owner::tasks()[i], and the inputs of its residual tasks flattened in task order (see
/// dcr/refit/owner.hpp; empty when the owner has no residual task).
struct owner_binding {
  owner* owner_ptr;
  std::vector<std::span<const std::byte>> candidates;
  std::vector<std::span<const std::byte>> residual_inputs{};
};

struct attempt_report {
  std::uint32_t attempt = 0;
  encoding_policy policy = encoding_policy::mixed;
  bool succeeded = false;
  std::string failure;                ///< first error seen, empty on success
  std::uint64_t payloads = 0;
  std::uint64_t payload_bytes = 0;    ///< unique payload bytes published (before replication)
  std::uint64_t records = 0;          ///< records emitted by owners
  std::uint64_t changed_elements = 0; ///< changed source elements of affine shards
  std::uint64_t compared_bytes = 0;   ///< affine shard bytes compared
  std::uint64_t residual_compared_bytes = 0;   ///< residual input bytes compared
  std::uint64_t residual_changed_inputs = 0;   ///< residual inputs flagged changed
  std::uint64_t residual_conversions = 0;      ///< residual outputs rebuilt
  std::uint64_t residual_changed_elements = 0; ///< canonical elements changed in those outputs
  std::uint64_t residual_items = 0;            ///< items built by residual tasks
  std::uint64_t forced_overwrite_items = 0;    ///< affine items overwritten for a receiver
  std::uint64_t duplicates_dropped = 0;
  std::uint64_t corrupt_refetched = 0;
  double detect_seconds = 0, project_seconds = 0, encode_seconds = 0, compress_seconds = 0;
  double residual_detect_seconds = 0, convert_seconds = 0, residual_compare_seconds = 0;
  double apply_seconds = 0;           ///< decode + apply, summed over receivers
  double commit_seconds = 0;
};

struct transition_report {
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 0;
  bool committed = false;
  /// Tensors some receiver takes only as overwrites (sorted, the union over receivers).
  std::vector<tensor_id> overwrite_only_tensors;
  std::vector<attempt_report> attempts;
};

/// Creates the commit record for `version` if there is none (first start of a deployment).
template <commit_store C>
void initialize_commit_record(C& store, std::uint64_t version, std::uint64_t fingerprint) {
  if (store.read().has_value()) return;
  store.compare_and_set(std::nullopt, commit_record{version, 0, fingerprint, 0});
}

/// Runs the transition base_version -> base_version + 1 (see the file comment).
template <transport T, commit_store C>
transition_report run_transition(const tensor_registry& registry, std::span<owner_binding> owners,
                                 std::span<receiver_endpoint* const> receivers, T& transport,
                                 C& commits, std::uint64_t base_version,
                                 const refit_options& options = {},
                                 const fault_plan& faults = {}) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };

  const auto committed = commits.read();
  DCR_EXPECTS(committed.has_value() && committed->version == base_version, errc::commit_conflict,
              "run_transition: commit record is at version " +
                  (committed ? std::to_string(committed->version) : std::string("<none>")) +
                  ", expected " + std::to_string(base_version));
  DCR_EXPECTS(committed->registry_fingerprint == registry.fingerprint(), errc::commit_conflict,
              "run_transition: commit record belongs to another model (fingerprint differs)");
  DCR_EXPECTS(options.max_attempts >= 1, errc::invalid_argument,
              "run_transition: max_attempts must be >= 1");

  transition_report report;
  report.base_version = base_version;
  report.target_version = base_version + 1;
  payload_encoder encoder(options.codec);
  std::vector<std::vector<std::byte>> payloads;
  std::vector<payload_id> ids;
  std::vector<std::byte> fetched;

  // Tensors some receiver can take only as overwrites; every owner must know before encoding.
  for (auto* rx : receivers) {
    const auto only = rx->overwrite_only_tensors();
    report.overwrite_only_tensors.insert(report.overwrite_only_tensors.end(), only.begin(),
                                         only.end());
  }
  std::sort(report.overwrite_only_tensors.begin(), report.overwrite_only_tensors.end());
  report.overwrite_only_tensors.erase(std::unique(report.overwrite_only_tensors.begin(),
                                                  report.overwrite_only_tensors.end()),
                                      report.overwrite_only_tensors.end());
  for (auto& binding : owners) binding.owner_ptr->set_overwrite_only(report.overwrite_only_tensors);

  std::uint32_t first_attempt = 0;
  while (transport.owners_listed(attempt_key{base_version, base_version + 1, first_attempt}) > 0)
    ++first_attempt;
  for (std::uint32_t a = first_attempt;
       a - first_attempt < options.max_attempts && !report.committed; ++a) {
    attempt_report ar;
    ar.attempt = a;
    ar.policy = a == 0 ? options.policy : encoding_policy::overwrite_only;
    const attempt_key key{base_version, base_version + 1, a};

    // Owners: detect, project, encode, compress, publish.
    for (auto& binding : owners) {
      owner& o = *binding.owner_ptr;
      const auto& items =
          o.build_items(binding.candidates, ar.policy, binding.residual_inputs, options.codec);
      const auto& s = o.stats();
      ar.changed_elements += s.changed_elements;
      ar.compared_bytes += s.compared_bytes;
      ar.residual_compared_bytes += s.residual_compared_bytes;
      ar.residual_changed_inputs += s.residual_changed_inputs;
      ar.residual_conversions += s.residual_conversions;
      ar.residual_changed_elements += s.residual_changed_elements;
      ar.residual_items += s.residual_items;
      ar.forced_overwrite_items += s.forced_overwrite_items;
      ar.detect_seconds += s.detect_seconds;
      ar.project_seconds += s.project_seconds;
      ar.encode_seconds += s.encode_seconds;
      ar.residual_detect_seconds += s.residual_detect_seconds;
      ar.convert_seconds += s.convert_seconds;
      ar.residual_compare_seconds += s.residual_compare_seconds;
      for (const auto& it : items) ar.records += it.count();
      payload_header header;
      header.id = payload_id{base_version, base_version + 1, a, o.id(), 0};
      header.registry_fingerprint = registry.fingerprint();
      const auto c0 = clock::now();
      pack_payloads(registry, header, items, options.bucket_bytes, encoder, payloads);
      ar.compress_seconds += seconds(clock::now() - c0);
      ids.clear();
      for (std::uint32_t k = 0; k < payloads.size(); ++k) {
        payload_id id = header.id;
        id.sequence = k;
        transport.publish(id, payloads[k]);
        ids.push_back(id);
        ar.payload_bytes += payloads[k].size();
      }
      ar.payloads += payloads.size();
      transport.publish_manifest(key, o.id(), ids);
    }

    // Receivers: fence earlier attempts, fetch everything listed, apply.
    const auto manifest = transport.manifest(key);
    bool all_applied = transport.owners_listed(key) == owners.size();
    if (!all_applied) ar.failure = "manifest incomplete";
    for (std::size_t r = 0; r < receivers.size(); ++r) {
      receiver_endpoint& rx = *receivers[r];
      rx.begin_attempt(key);
      const std::uint64_t duplicates_before = rx.stats().duplicates_dropped;
      const auto a0 = clock::now();
      try {
        for (std::size_t k = 0; k < manifest.size(); ++k) {
          const delivery_action action = faults ? faults(a, r, k) : delivery_action::deliver;
          if (action == delivery_action::fail_receiver)
            throw error(errc::transport_failure,
                        "receiver " + std::to_string(r) + " dropped out of attempt " +
                            std::to_string(a));
          transport.fetch(manifest[k], fetched);
          if (action == delivery_action::corrupt && !fetched.empty())
            fetched[(k * 7919) % fetched.size()] ^= std::byte{0x20};
          try {
            rx.apply_payload(fetched);
          } catch (const error& e) {
            if (e.dcr_code() != errc::corrupt_payload && e.dcr_code() != errc::truncated_payload)
              throw;
            ++ar.corrupt_refetched;  // a damaged download: fetch a fresh copy once
            transport.fetch(manifest[k], fetched);
            rx.apply_payload(fetched);
          }
          if (action == delivery_action::deliver_twice) rx.apply_payload(fetched);
        }
      } catch (const error& e) {
        all_applied = false;
        if (ar.failure.empty()) ar.failure = "receiver " + std::to_string(r) + ": " + e.what();
      }
      ar.apply_seconds += seconds(clock::now() - a0);
      ar.duplicates_dropped += rx.stats().duplicates_dropped - duplicates_before;
    }

    // Joint commit.
    if (all_applied) {
      const auto c0 = clock::now();
      const commit_record next{base_version + 1, a, registry.fingerprint(), committed->membership_epoch + 1};
      DCR_EXPECTS(commits.compare_and_set(committed, next), errc::commit_conflict,
                  "run_transition: commit record changed during the transition");
      for (auto& binding : owners)
        binding.owner_ptr->commit(binding.candidates, binding.residual_inputs);
      for (auto* rx : receivers) rx->end_transition(base_version + 1);
      ar.commit_seconds = seconds(clock::now() - c0);
      ar.succeeded = true;
      report.committed = true;
    }
    report.attempts.push_back(std::move(ar));
  }
  return report;
}

}  // namespace dcr
