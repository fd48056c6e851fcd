// tools/dcr/simulate_agent_coordinator.cpp: the coordinator process of `dcr simulate` (simulate_agents.hpp).
#include "simulate_agents.hpp"

#include "dcr/protocol/coordinator.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {

int run_coordinator(const simulate_settings& s) {
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const dcr::sim::synthetic_trainer layout(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                           s.trainer_layout, dcr::sim::trainer_selection::none());
  return with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
    return with_coordinator_store(s, [&](auto& store) {
      dcr::coordinator_options o;
      o.keys = keys;
      o.policy = s.options.policy;
      o.min_receivers = s.restarted ? 0 : static_cast<std::size_t>(s.receiver_tp);
      o.before_commit = [&](const dcr::attempt_record& a) {
        if (kill_here(s, "coordinator", a.key.target_version)) ::raise(SIGKILL);
      };
      dcr::coordinator coord(plane, store, registry.fingerprint(), owner_ids(layout), o);
      const auto deadline = deadline_of(s);
      coord.initialize(0, deadline);
      const auto v0 = wait_for_commit_record(plane, keys, deadline);
      for (auto step = v0 + 1; step <= static_cast<std::uint64_t>(s.steps); ++step) {
        const auto t = coord.run_transition("step " + std::to_string(step), deadline_of(s));
        // The commit happened before the cleanup; the first attempt record t.seconds before it.
        const double end_unix = dcr::unix_seconds_now() - t.cleanup_seconds;
        const double begin_unix = end_unix - t.seconds;
        json j{{"step", step}, {"begin_unix", begin_unix}, {"wait_seconds", t.wait_seconds}, {"cleanup_seconds", t.cleanup_seconds}, {"end_unix", end_unix}, {"committed", t.committed}, {"committed_by_other", t.committed_by_other},
               {"seconds", t.seconds}, {"commit_seconds", t.commit_seconds}, {"restores", t.restores}};
        json attempts = json::array();
        for (const auto& a : t.attempts) {
          json owners = json::array(), acks = json::array();
          for (const auto& r : a.reports) owners.push_back(r);
          for (const auto& k : a.acks) acks.push_back(k);
          attempts.push_back({{"attempt", a.key.number}, {"kind", a.kind}, {"policy", a.policy},
                              {"committed", a.committed}, {"failure", a.failure},
                              {"seconds", a.seconds}, {"reports", owners}, {"acks", acks}});
        }
        j["attempts"] = attempts;
        append_line(s, j);
        if (!t.committed) return 1;
      }
      return 0;
    });
  });
}

}  // namespace dcr_tool
