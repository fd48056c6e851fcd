// tools/dcr/simulate_agent_owner.cpp: an owner process of `dcr simulate` (simulate_agents.hpp): one
// trainer rank's owner agent over the synthetic trainer's shards.
#include "simulate_agents.hpp"

#include "dcr/protocol/owner_agent.hpp"
#include "dcr/sim/rank_owner.hpp"
#include "simulate_backends.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {

int run_owner(const simulate_settings& s) {
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const auto rank = static_cast<std::uint32_t>(s.id);
  dcr::sim::synthetic_trainer trainer(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                      s.trainer_layout,
                                      dcr::sim::trainer_selection::owned_by(rank));
  const dcr::sim::rank_owner built = dcr::sim::make_rank_owner(registry, trainer, rank);
  dcr::owner& owner = *built.owner;
  // --device cuda: detect + compact, projection and tracker updates on the GPU (trackers in
  // device memory; each step's candidate shards copied there, as a trainer's would already be).
  const auto device_detect = make_detect_backend(s.device, s.id);
  if (device_detect) owner.set_detect_backend(device_detect.get());
  auto spans = [&](std::vector<std::span<const std::byte>>& c,
                   std::vector<std::span<const std::byte>>& in) { built.spans(trainer, c, in); };
  const dcr::sim::stress_schedule schedule(s.rate);
  return with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
    return with_owner_store(s, [&](auto& store) {
      const auto deadline = deadline_of(s);
      // Trackers from the committed version (a restarted owner regenerates version v from the
      // seed, as a framework would reload its checkpoint of v).
      const auto v = wait_for_commit_record(plane, keys, deadline);
      trainer.advance_to(v, schedule);
      std::vector<std::span<const std::byte>> cand, inputs;
      spans(cand, inputs);
      owner.initialize(cand, inputs);
      dcr::owner_agent_options o;
      o.keys = keys;
      o.bucket_bytes = s.options.bucket_bytes;
      o.chunk_bytes = s.options.bucket_bytes;
      o.codec = s.options.codec;
      o.pipelined = s.pipelined;
      o.build_threads = s.owner_threads;
      o.after_put = [&](const dcr::attempt_record& a, std::uint64_t n) {
        if (n == 1 && a.kind == dcr::attempt_kind::refit && kill_here(s, "owner", a.key.target_version))
          ::raise(SIGKILL);
      };
      dcr::owner_agent agent(owner, registry, plane, store, o);
      agent.start(v, deadline, s.restarted);
      for (auto step = v + 1; step <= static_cast<std::uint64_t>(s.steps); ++step) {
        trainer.advance_to(step, schedule);
        spans(cand, inputs);
        const auto t0 = protocol_clock::now();
        const auto flows0 = flow_bytes();
        agent.serve_transition("step " + std::to_string(step), cand, inputs, deadline_of(s));
        json j{{"step", step}, {"report", agent.last_report()},
               {"seconds", std::chrono::duration<double>(protocol_clock::now() - t0).count()},
               {"tracker_bytes", owner.tracker_bytes()}, {"flows", flow_bytes_since(flows0)}};
        const std::string device = owner.detect_device();
        j["devices"] = {{"detect", device}, {"project", device}, {"tracker_update", device}};
        j["timeline"] = timeline_json(agent.last_timeline());
        append_line(s, j);
      }
      return 0;
    });
  });
}

}  // namespace dcr_tool
