// dcr/detail/protocol/in_process.inl: the bodies of dcr/protocol/in_process.hpp (included at
// its end): compiled once in separate compilation (DCR_HEADER_BODIES, dcr/config.hpp), with
// the agents and coordinator they instantiate.
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "dcr/protocol/receiver_agent.hpp"

namespace dcr {

struct in_process_refit::deployment {
  memory_control_plane plane;
  memory_payload_store store;
  /// Initializes the committed version (run() makes its own coordinator per transition).
  std::unique_ptr<coordinator<plane_type, store_type>> initial_coordinator;
  std::vector<std::unique_ptr<owner_agent<plane_type, store_type>>> owner_agents;
  std::vector<std::unique_ptr<payload_source_base>> base_sources;
  std::vector<std::unique_ptr<source_ref>> refs;
  std::vector<std::unique_ptr<receiver_agent<plane_type, source_ref>>> receiver_agents;
};

namespace detail {
DCR_INLINE std::vector<std::uint32_t> owner_ids(std::span<const owner_binding> owners) {
  std::vector<std::uint32_t> ids;
  for (const auto& b : owners) ids.push_back(b.owner_ptr->id());
  return ids;
}
/// A coordinator's summary as the driver's report: refit attempts only, owners' and receivers'
/// figures summed, and the union of the receivers' overwrite-only tensors.
DCR_INLINE transition_report to_report(const transition_summary& s, memory_control_plane& plane) {
  transition_report out;
  out.base_version = s.base_version;
  out.target_version = s.target_version;
  out.committed = s.committed;
  out.seconds = s.seconds;
  for (const auto& a : s.attempts) {
    if (a.kind != attempt_kind::refit) continue;
    attempt_report r;
    r.attempt = a.key.number;
    r.policy = a.policy;
    r.succeeded = a.committed;
    r.failure = a.failure;
    r.seconds = a.seconds;
    if (a.committed) r.commit_seconds = s.commit_seconds;
    for (const auto& o : a.reports) {
      r.payloads += o.payloads;
      r.payload_bytes += o.payload_bytes;
      r.records += o.records;
      r.owners += o.stats;
      r.compress_seconds += o.compress_seconds;
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
  for (const auto& reg : read_records<receiver_registration>(plane, protocol_keys{}.receivers()))
    out.overwrite_only_tensors.insert(out.overwrite_only_tensors.end(), reg.overwrite_only.begin(),
                                      reg.overwrite_only.end());
  std::sort(out.overwrite_only_tensors.begin(), out.overwrite_only_tensors.end());
  out.overwrite_only_tensors.erase(
      std::unique(out.overwrite_only_tensors.begin(), out.overwrite_only_tensors.end()),
      out.overwrite_only_tensors.end());
  return out;
}
}  // namespace detail

DCR_INLINE in_process_refit::in_process_refit(const tensor_registry& registry,
                                              std::span<owner_binding> owners,
                                              std::span<receiver_endpoint* const> receivers,
                                              std::uint64_t version)
    : registry_(&registry),
      owners_(owners.begin(), owners.end()),
      d_(std::make_unique<deployment>()) {
  const auto deadline = protocol_clock::now() + std::chrono::seconds(30);
  coordinator_options co;
  co.min_receivers = receivers.size();
  d_->initial_coordinator = std::make_unique<coordinator<plane_type, store_type>>(
      d_->plane, d_->store, registry.fingerprint(), detail::owner_ids(owners_), co);
  d_->initial_coordinator->initialize(version, deadline);
  for (auto& b : owners_) {
    d_->owner_agents.push_back(std::make_unique<owner_agent<plane_type, store_type>>(
        *b.owner_ptr, registry, d_->plane, d_->store));
    d_->owner_agents.back()->start(version, deadline);
  }
  for (std::size_t r = 0; r < receivers.size(); ++r) {
    d_->base_sources.push_back(
        std::make_unique<erased_source<store_source<store_type>>>(d_->store));
    d_->refs.push_back(std::make_unique<source_ref>());
    d_->refs.back()->point_at(*d_->base_sources.back());
    d_->receiver_agents.push_back(std::make_unique<receiver_agent<plane_type, source_ref>>(
        "receiver-" + std::to_string(r), *receivers[r], registry.fingerprint(), d_->plane,
        *d_->refs.back()));
    d_->receiver_agents.back()->start(version, true, deadline);
  }
}

DCR_INLINE in_process_refit::~in_process_refit() = default;

DCR_INLINE transition_report in_process_refit::run(const refit_options& options,
                                                   const source_decorator& decorate) {
  const auto deadline = protocol_clock::now() + std::chrono::seconds(300);
  const std::uint64_t v = version();
  const std::string candidate = "run " + std::to_string(++runs_);
  std::vector<std::unique_ptr<payload_source_base>> decorated(d_->receiver_agents.size());
  for (std::size_t r = 0; r < d_->receiver_agents.size(); ++r) {
    if (decorate) decorated[r] = decorate(r, *d_->base_sources[r]);
    d_->refs[r]->point_at(decorated[r] ? *decorated[r] : *d_->base_sources[r]);
  }
  coordinator_options co = d_->initial_coordinator->options();
  co.policy = options.policy;
  co.max_attempts = options.max_attempts;
  co.min_receivers = 0;
  co.erase_after_commit = !options.keep_payloads;
  coordinator<plane_type, store_type> coord(d_->plane, d_->store, registry_->fingerprint(),
                                            detail::owner_ids(owners_), co);
  for (auto& a : d_->owner_agents) a->set_codec(options.bucket_bytes, options.codec);

  std::atomic<bool> stop{false};
  std::atomic<std::size_t> running{d_->owner_agents.size() + d_->receiver_agents.size()};
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < d_->owner_agents.size(); ++k)
    threads.emplace_back([&, k] {
      try {
        d_->owner_agents[k]->serve_transition(candidate, owners_[k].candidates,
                                              owners_[k].residual_inputs, deadline, &stop);
      } catch (const error&) {  // stopped, or the transition did not commit
      }
      --running;
    });
  for (auto& a : d_->receiver_agents)
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
  const auto grace =
      protocol_clock::now() + std::chrono::seconds(failure || !summary.committed ? 0 : 10);
  while (running.load() > 0 && protocol_clock::now() < grace)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (running.load() > 0) {
    stop = true;
    put(d_->plane, "/dcr/wake", std::to_string(runs_));  // wake every waiter
  }
  for (auto& t : threads) t.join();
  for (auto& ref : d_->refs) ref->point_at(*d_->base_sources[&ref - &d_->refs[0]]);
  if (failure) std::rethrow_exception(failure);
  return detail::to_report(summary, d_->plane);
}

DCR_INLINE in_process_refit::plane_type& in_process_refit::plane() noexcept { return d_->plane; }
DCR_INLINE in_process_refit::store_type& in_process_refit::store() noexcept { return d_->store; }

DCR_INLINE std::uint64_t in_process_refit::version() {
  return read_record<commit_record>(d_->plane, protocol_keys{}.commit())->value.version;
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
