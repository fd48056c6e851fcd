// tools/dcr/simulate_agent_receiver.hpp: the receiver process of `dcr simulate`
// (simulate_agents.hpp), as a template over its control plane: one serving rank's receiver
// agent, checked against a dense refit after its steps. Tool-internal; instantiated in
// simulate_agent_receiver.cpp.
#pragma once

#include <atomic>
#include <map>
#include <memory>

#include "dcr/protocol/receiver_agent.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/testing/faults.hpp"
#include "simulate_agents.hpp"
#include "simulate_backends.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {

/// The receiver process over `plane` (keys under `keys`); returns the process's exit status.
template <dcr::control_plane Plane>
int run_receiver_over(const simulate_settings& s, Plane& plane, const dcr::protocol_keys& keys) {
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const int rank = s.id;
  const dcr::sim::synthetic_trainer model(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                          s.trainer_layout, dcr::sim::trainer_selection::none());
  const dcr::sim::stress_schedule schedule(s.rate);
  dcr::sim::moe_engine_storage storage(s.model, s.receiver_tp, rank, s.engine_layout);
  dcr::sim::moe_engine_loader loader(storage);
  dcr::receiver<dcr::sim::moe_engine_loader> rx(registry, loader, dcr::apply_options{s.path, false});
  rx.prewarm();
  // --device cuda: the compiled path's writes go into a device copy of this rank's storage; it
  // is filled from the host after the dense load and copied back before each verification.
  const auto device_apply = make_apply_backend(s.device, storage.buffers(), s.id);
  if (device_apply) rx.set_apply_backend(device_apply.get());
  std::unique_ptr<dcr::sim::moe_engine_storage> reference;
  std::vector<std::byte> canonical;
  // Dense load of version `step`, one canonical tensor at a time, through `target`'s loader.
  auto dense_load = [&](dcr::receiver<dcr::sim::moe_engine_loader>& target, std::uint64_t step) {
    for (std::size_t id = 0; id < registry.size(); ++id) {
      const auto& t = registry.at(static_cast<dcr::tensor_id>(id));
      canonical.resize(static_cast<std::size_t>(t.bytes()));
      model.canonical_at(static_cast<dcr::tensor_id>(id), step, schedule, canonical);
      dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        target.template dense_load<W>(static_cast<dcr::tensor_id>(id),
                                      dcr::tensor_view<const W>::contiguous(
                                          reinterpret_cast<const W*>(canonical.data()), t.shape));
      });
    }
  };
  return with_receiver_source(s, [&](auto& source) {
    const auto deadline = deadline_of(s);
    const auto v = wait_for_commit_record(plane, keys, deadline);
    // A first start loads version v from its "checkpoint" (the seed); a restarted receiver has
    // lost its storage and is restored through the protocol.
    if (!s.restarted) dense_load(rx, v);
    if (device_apply) device_apply->upload_storage();  // a restarted one: its fresh storage
    dcr::receiver_agent_options o;
    o.keys = keys;
    o.asynchronous = s.asynchronous;
    o.after_apply = [&](const dcr::attempt_record& a, std::uint64_t n) {
      if (n == 1 && a.kind == dcr::attempt_kind::refit && kill_here(s, "receiver", a.key.target_version))
        ::raise(SIGKILL);
    };
    std::atomic<int> gate_closes{0}, gate_opens{0};
    dcr::request_gate gate{[&] { ++gate_closes; }, [&] { ++gate_opens; }};
    auto serve = [&](auto& src) {
      dcr::receiver_agent agent("r" + std::to_string(rank), rx, registry.fingerprint(), plane, src,
                                o, gate);
      agent.start(v, !s.restarted, deadline);
      // A step's line: what it served (and the bytes it moved over its node's flow) and,
      // where it verifies, the dense-refit comparison.
      auto report_step = [&](std::uint64_t held, double serve_seconds,
                             const std::map<std::string, std::uint64_t>& flows, bool check) {
        if (!check) {  // --verify last: only the timeline and counters of this step
          json j{{"step", held}, {"bit_exact", true}, {"verified", false}, {"mismatch", ""},
                 {"name", agent.name()}, {"ack", agent.last_ack()}, {"serve_seconds", serve_seconds},
                 {"restores", agent.restores()}, {"stale_refused", agent.stale_refused()},
                 {"apply_device", rx.apply_device()}, {"flows", flows}};
          j["timeline"] = timeline_json(agent.last_timeline());
          append_line(s, j);
          return;
        }
        // A dense refit of version `held` through this receiver's own loader, into fresh
        // storage, compared byte for byte (padding included).
        const auto v0 = protocol_clock::now();
        if (device_apply) device_apply->download_storage();
        if (!reference)
          reference = std::make_unique<dcr::sim::moe_engine_storage>(s.model, s.receiver_tp, rank,
                                                                     s.engine_layout);
        reference->reset();
        dcr::sim::moe_engine_loader ref_loader(*reference);
        dcr::receiver<dcr::sim::moe_engine_loader> ref_rx(registry, ref_loader,
                                                          dcr::apply_options{s.path, false});
        dense_load(ref_rx, held);
        const auto diff = storage.first_difference(*reference);
        json j{{"step", held}, {"bit_exact", diff.empty()}, {"mismatch", diff},
               {"name", agent.name()}, {"ack", agent.last_ack()}, {"serve_seconds", serve_seconds},
               {"verify_seconds", std::chrono::duration<double>(protocol_clock::now() - v0).count()},
               {"restores", agent.restores()}, {"stale_refused", agent.stale_refused()},
               {"gate_closes", gate_closes.load()}, {"gate_opens", gate_opens.load()},
               {"storage_bytes", storage.bytes()}, {"apply_device", rx.apply_device()},
               {"flows", flows}};
        j["timeline"] = timeline_json(agent.last_timeline());
        append_line(s, j);
      };
      std::uint64_t held = v;
      if (s.restarted) {  // restored through the protocol first, then verified
        const auto t0 = protocol_clock::now();
        const auto flows0 = flow_bytes();
        held = agent.serve_until(v, deadline_of(s));
        report_step(held, std::chrono::duration<double>(protocol_clock::now() - t0).count(),
                    flow_bytes_since(flows0), true);
      }
      while (held < static_cast<std::uint64_t>(s.steps)) {
        const auto t0 = protocol_clock::now();
        const auto flows0 = flow_bytes();
        held = agent.serve_until(held + 1, deadline_of(s));
        const double served = std::chrono::duration<double>(protocol_clock::now() - t0).count();
        report_step(held, served, flow_bytes_since(flows0),
                    s.verify_every || held >= static_cast<std::uint64_t>(s.steps));
      }
      return 0;
    };
    // The injected delivery faults (--fault, rank 0 only). Every receiver reads through the
    // decorator, which passes everything through when it has no choice to make: one receiver
    // agent per source type, not two.
    dcr::testing::fault_choice choice;
    if (s.fault != "none" && rank == 0) {
      const auto step = static_cast<std::uint64_t>(s.fault_step);
      dcr::testing::delivery_fault kind = dcr::testing::delivery_fault::none;
      if (s.fault == "duplicate") kind = dcr::testing::delivery_fault::duplicate;
      if (s.fault == "corrupt") kind = dcr::testing::delivery_fault::corrupt;
      if (s.fault == "drop-receiver") kind = dcr::testing::delivery_fault::drop;
      if (s.fault == "reorder") kind = dcr::testing::delivery_fault::reorder;
      if (s.fault == "delay") kind = dcr::testing::delivery_fault::delay;
      if (s.fault == "stale") kind = dcr::testing::delivery_fault::stale;
      // stale needs a failed attempt first: drop the second delivery of attempt 0, then
      // deliver a kept payload of attempt 0 during attempt 1.
      choice = [=](const dcr::attempt_key& key, std::uint64_t ordinal) {
        if (key.target_version != step) return dcr::testing::delivery_fault::none;
        if (kind == dcr::testing::delivery_fault::stale) {
          if (key.number == 0 && ordinal == 1) return dcr::testing::delivery_fault::drop;
          if (key.number > 0 && ordinal == 0) return dcr::testing::delivery_fault::stale;
          return dcr::testing::delivery_fault::none;
        }
        return key.number == 0 && ordinal == 0 ? kind : dcr::testing::delivery_fault::none;
      };
    }
    dcr::testing::faulty_source<std::remove_reference_t<decltype(source)>> faulty(source,
                                                                                   std::move(choice));
    return serve(faulty);
  });
}

}  // namespace dcr_tool
