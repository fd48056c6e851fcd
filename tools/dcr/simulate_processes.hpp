// tools/dcr/simulate_processes.hpp: `dcr simulate` as separate OS processes (the default): the
// coordinator, every owner and every receiver in a process of its own, talking only through a
// payload store and a control plane (docs/simulate.md, docs/protocol.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/protocol/in_process.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/apply/apply.hpp"
#include "dcr/exec/device.hpp"
#include "simulate_chaos.hpp"

namespace dcr_tool {

/// Everything `dcr simulate` was told, shared by the parent and its agent processes.
struct simulate_settings {
  std::uint64_t size = 0;
  std::int64_t steps = 3;
  double rate = 0.01;
  std::uint64_t seed = 1;
  dcr::sim::moe_config model;
  int trainer_tp = 2, trainer_dp = 2, receiver_tp = 4;
  dcr::sim::trainer_layout trainer_layout = dcr::sim::trainer_layout::megatron;
  dcr::sim::engine_layout engine_layout = dcr::sim::engine_layout::serving;
  dcr::apply_path path = dcr::apply_path::compiled;
  std::string apply_path_text = "compiled";
  dcr::refit_options options;
  std::string fault = "none";
  std::int64_t fault_step = 2;
  bool json = false;
  /// Where owners detect and receivers apply (--device); the parent has checked with
  /// dcr_tool::select_device that it can run here.
  dcr::exec::device_kind device = dcr::exec::device_kind::cpu;
  std::string device_description = "cpu";  ///< select_device's description (parent only)
  // Processes.
  std::string commit = "file";  ///< file[:DIR] | etcd://HOST:PORT[/PREFIX] | memory
  std::string store;            ///< payload store directory ("" = in the work directory)
  std::string transport = "file";  ///< --transport: file | s3://BUCKET[/PREFIX] (simulate_transport.hpp)
  /// --transport s3://...: the service (--s3-endpoint, "" for AWS), signing region
  /// (--s3-region, "" for the environment's), addressing (--s3-addressing: "" for the default,
  /// path or virtual), fan-out inside the rollout cluster (--s3-fanout), gets in flight per
  /// receiver (--s3-parallel-gets) and the multipart threshold (--s3-multipart-mb).
  std::string s3_endpoint, s3_region, s3_addressing;
  bool s3_fanout = false;
  int s3_parallel_gets = 4;
  std::int64_t s3_multipart_mb = 64;
  /// Nodes: owner processes are grouped into trainer nodes (trainer rank % trainer_nodes) and receiver ranks
  /// into rollout nodes (rank % rollout_nodes); each node has one cross-cluster flow, shaped
  /// to link_rate bytes per second (0: unlimited, counted only). Local links are not shaped.
  int trainer_nodes = 1, rollout_nodes = 1;
  double link_rate = 0;
  bool reference = false;  ///< --reference: also time the full checkpoint through object storage
  /// --transport relay (simulate_transport.hpp): roots (each its own process), cross-cluster
  /// flows per root, the first port (roots listen on base + k, receiver rank r's node on
  /// base + roots + r; 0: the parent picks a free range), and the TLS files (a directory as
  /// scripts/make-test-certs.sh writes it; "": the parent makes a throwaway CA in the work
  /// directory).
  int relay_roots = 4, relay_flows = 1;
  int relay_port_base = 0;
  std::string relay_certs;
  bool keep = false;
  bool asynchronous = false;
  bool pipelined = true;
  std::size_t owner_threads = 1;  ///< --owner-threads: owner_agent_options::build_threads
  bool verify_every = true;  ///< false (--verify last): receivers verify the last step only
  /// --kill: each fires once (the agent marks it in WORKDIR/results/kills/ before it dies), so
  /// a process restarted after one kill can be killed again at a later step.
  std::vector<kill_request> kills;
  std::int64_t commit_outage = -1;
  /// --chaos SEED (parent only): the parent draws the kills, the outage and the corrupted
  /// payload (simulate_chaos.hpp) and passes them to the agents as --kill, --commit-outage and
  /// --fault corrupt --fault-step. chaos_kills: kills per role (-1: default_chaos_kills).
  std::optional<std::uint64_t> chaos_seed;
  int chaos_kills = -1;
  double timeout_seconds = 300;
  // An agent process (set by the parent when it starts one).
  std::string role;
  int id = 0;
  std::string workdir;
  bool restarted = false;
  std::vector<std::string> argv;  ///< the arguments the parent was given
};

/// The parent: starts every agent process, restarts the killed ones, injects outages, and
/// reports. Returns the exit code (0 only if every step committed once and is bit-exact).
int run_simulate_processes(const simulate_settings& s);

/// One agent process (s.role). Returns its exit code.
int run_simulate_agent(const simulate_settings& s);

}  // namespace dcr_tool
