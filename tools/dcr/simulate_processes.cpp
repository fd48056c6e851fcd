// tools/dcr/simulate_processes.cpp: `dcr simulate` across processes (see simulate_processes.hpp).
//
// The parent makes a work directory (a file control plane and a file payload store unless told
// otherwise), starts `dcr simulate ... --role R --id N --workdir DIR` for the coordinator, each
// owner and each receiver, and waits. Each agent computes only its own part of the synthetic
// model from the seed and the step (dcr::sim::trainer_selection), and appends one JSON line per
// step to DIR/results/<role>-<id>.jsonl. A process killed by `--kill` (it SIGKILLs itself at the
// named point) is started again with --restarted and recovers as the protocol says. The parent
// reads the lines and the children's peak memory (wait4) and reports. With --transport relay the
// parent first makes the TLS files (unless --relay-certs), picks the ports and starts the relay
// roots, processes that serve until the agents are done (then SIGTERM; simulate_transport.hpp).
#include "simulate_processes.hpp"

#include <fmt/core.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "args.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/receiver_agent.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/rank_owner.hpp"
#include "dcr/testing/faults.hpp"
#include "simulate_backends.hpp"
#include "simulate_reference.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using dcr::protocol_clock;

protocol_clock::time_point deadline_of(const simulate_settings& s) {
  return protocol_clock::now() +
         std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_seconds * 1000));
}

std::string plane_dir(const simulate_settings& s) {
  if (s.commit.rfind("file:", 0) == 0) return s.commit.substr(5);
  return (fs::path(s.workdir) / "control").string();
}
/// Stage spans as JSON (what scripts/protocol-timeline.py draws).
json timeline_json(const std::vector<dcr::stage_span>& spans) {
  json out = json::array();
  for (const auto& span : spans)
    out.push_back({{"stage", span.stage}, {"begin", span.begin}, {"end", span.end}});
  return out;
}

bool uses_etcd(const simulate_settings& s) { return s.commit.rfind("etcd", 0) == 0; }

/// "cuda", "cpu", or "cpu+cuda" when processes disagree (they do not; a report would show it).
std::string joined(const std::set<std::string>& names, const std::string& fallback) {
  if (names.empty()) return fallback;
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : "+") + n;
  return out;
}

/// Calls f(plane, keys) with the control plane the settings name.
template <class F>
int with_plane(const simulate_settings& s, F&& f) {
  if (uses_etcd(s)) {
    const auto address = dcr::etcd_control_plane::parse_address(s.commit);
    dcr::etcd_control_plane plane(address.endpoint, address.options);
    dcr::protocol_keys keys{address.key_prefix};
    return f(plane, keys);
  }
  dcr::file_control_plane plane(plane_dir(s));
  return f(plane, dcr::protocol_keys{});
}

/// Where an agent marks a kill of it as fired: WORKDIR/results/kills/<role>-<id>-<step>.
fs::path kill_marker(const simulate_settings& s, const std::string& role, std::uint64_t step) {
  return fs::path(s.workdir) / "results" / "kills" / fmt::format("{}-{}-{}", role, s.id, step);
}

/// Whether to SIGKILL this process now: a --kill names its role, id and the step `target`, and
/// has not fired yet. The first caller creates the kill's marker (O_EXCL), so the process
/// started again after it (or another thread) never fires the same kill twice, while a later
/// kill of the same process still fires; the parent reads the markers to count the kills.
bool kill_here(const simulate_settings& s, const char* role, std::uint64_t target) {
  for (const auto& k : s.kills)
    if (k.role == role && k.id == s.id && static_cast<std::uint64_t>(k.step) == target) {
      const int fd = ::open(kill_marker(s, role, target).c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
      if (fd < 0) return false;  // fired before (or unmarkable: then it never fires, so never twice)
      ::close(fd);
      return true;
    }
  return false;
}

void append_line(const simulate_settings& s, const json& j) {
  const auto path = fs::path(s.workdir) / "results" / (s.role + "-" + std::to_string(s.id) + ".jsonl");
  std::ofstream out(path, std::ios::app);
  out << j.dump() << "\n";
}

std::vector<std::uint32_t> owner_ids(const dcr::sim::synthetic_trainer& t) {
  std::set<std::uint32_t> ids;
  for (auto o : t.owners()) ids.insert(o);
  for (auto o : t.residual_owners()) ids.insert(o);
  return {ids.begin(), ids.end()};
}

template <class Plane>
std::uint64_t wait_for_commit_record(Plane& plane, const dcr::protocol_keys& keys,
                                     protocol_clock::time_point deadline) {
  for (;;) {
    auto c = dcr::with_retry("agent: read commit", deadline, [&] {
      return dcr::read_record<dcr::commit_record>(plane, keys.commit());
    });
    if (c) return c->value.version;
    DCR_EXPECTS(protocol_clock::now() < deadline, dcr::errc::deadline_exceeded,
                "no commit record appeared (is the coordinator running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---- the agents

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

int run_receiver(const simulate_settings& s) {
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
  std::vector<std::byte> canonical, scratch;
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
  return with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
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
        dcr::testing::faulty_source<std::remove_reference_t<decltype(source)>> faulty(
            source, [=](const dcr::attempt_key& key, std::uint64_t ordinal) {
              if (key.target_version != step) return dcr::testing::delivery_fault::none;
              if (kind == dcr::testing::delivery_fault::stale) {
                if (key.number == 0 && ordinal == 1) return dcr::testing::delivery_fault::drop;
                if (key.number > 0 && ordinal == 0) return dcr::testing::delivery_fault::stale;
                return dcr::testing::delivery_fault::none;
              }
              return key.number == 0 && ordinal == 0 ? kind : dcr::testing::delivery_fault::none;
            });
        return serve(faulty);
      }
      return serve(source);
    });
  });
}

// ---- the parent

struct child {
  std::string role;
  int id = 0;
  bool service = false;  // a relay root: serves until the agents are done, then SIGTERM
  pid_t pid = -1;
  bool restarted = false;
  int restarts = 0;  // how many times it was started again after a planned kill
  bool running = false;
  int status = 0;
  std::uint64_t peak_rss_bytes = 0;
};

std::vector<std::string> child_args(const simulate_settings& s, const std::string& role, int id,
                                    bool restarted) {
  std::vector<std::string> a{"dcr", "simulate"};
  // The relay's ports and TLS files as the parent resolved them replace what it was given.
  for (std::size_t i = 0; i < s.argv.size(); ++i) {
    const auto& arg = s.argv[i];
    if (uses_relay(s) && (arg == "--relay-port-base" || arg == "--relay-certs")) {
      ++i;
      continue;
    }
    if (uses_relay(s) && (arg.rfind("--relay-port-base=", 0) == 0 || arg.rfind("--relay-certs=", 0) == 0)) continue;
    // A chaos run's agents get the drawn schedule as plain flags (below) instead of the seed.
    if (arg == "--chaos" || arg == "--chaos-kills") {
      ++i;
      continue;
    }
    if (arg.rfind("--chaos=", 0) == 0 || arg.rfind("--chaos-kills=", 0) == 0) continue;
    a.push_back(arg);
  }
  if (s.chaos_seed) {
    for (const auto& k : s.kills) a.insert(a.end(), {"--kill", fmt::format("{}/{}:{}", k.role, k.id, k.step)});
    if (s.commit_outage >= 1) a.insert(a.end(), {"--commit-outage", std::to_string(s.commit_outage)});
    if (s.fault != "none") a.insert(a.end(), {"--fault", s.fault, "--fault-step", std::to_string(s.fault_step)});
  }
  if (uses_relay(s))
    a.insert(a.end(), {"--relay-port-base", std::to_string(s.relay_port_base), "--relay-certs", s.relay_certs});
  a.insert(a.end(), {"--role", role, "--id", std::to_string(id), "--workdir", s.workdir});
  if (restarted) a.push_back("--restarted");
  return a;
}

pid_t spawn(const std::vector<std::string>& args, bool service = false) {
  const pid_t pid = ::fork();
  if (pid < 0) throw dcr::error(dcr::errc::io_error, "dcr simulate: fork failed");
  if (pid == 0) {
    if (service) ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a root never outlives its parent
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  return pid;
}

std::vector<json> read_lines(const fs::path& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// ---- the relay's setup in the parent

/// Whether every port of [base, base + count) can be bound on 127.0.0.1 now.
bool ports_free(int base, int count) {
  for (int p = base; p < base + count; ++p) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(p));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!ok) return false;
  }
  return true;
}

/// Resolves --relay-port-base (a free range when not given) and --relay-certs (a throwaway CA
/// in the work directory when not given).
void prepare_relay(simulate_settings& s) {
  const int count = s.relay_roots + s.receiver_tp;
  if (s.relay_port_base == 0) {
    std::mt19937 rng(std::random_device{}());
    for (int tries = 0; tries < 200 && s.relay_port_base == 0; ++tries) {
      const int base = 20000 + static_cast<int>(rng() % 30000);
      if (ports_free(base, count)) s.relay_port_base = base;
    }
    DCR_EXPECTS(s.relay_port_base != 0, dcr::errc::transport_failure,
                "dcr simulate: no range of " + std::to_string(count) + " free ports on 127.0.0.1 (give --relay-port-base)");
  }
  DCR_EXPECTS(s.relay_port_base + count <= 65536, dcr::errc::invalid_argument,
              "dcr simulate: --relay-port-base " + std::to_string(s.relay_port_base) + " leaves no room for " +
                  std::to_string(count) + " ports");
  if (s.relay_certs.empty()) {
    s.relay_certs = (fs::path(s.workdir) / "certs").string();
    const std::string script = DCR_MAKE_TEST_CERTS;
    DCR_EXPECTS(fs::exists(script), dcr::errc::invalid_argument,
                "dcr simulate: --transport relay without --relay-certs needs " + script +
                    " (or make a CA and certificates yourself and pass --relay-certs DIR)");
    const std::string cmd = "bash '" + script + "' '" + s.relay_certs + "' owner root node";
    DCR_EXPECTS(std::system(cmd.c_str()) == 0, dcr::errc::io_error, "dcr simulate: '" + cmd + "' failed");
  }
  for (const char* f : {"ca.pem", "owner.pem", "owner.key", "root.pem", "root.key", "node.pem", "node.key"})
    DCR_EXPECTS(fs::exists(fs::path(s.relay_certs) / f), dcr::errc::invalid_argument,
                "dcr simulate: --relay-certs " + s.relay_certs + " has no " + f +
                    " (scripts/make-test-certs.sh DIR makes a throwaway set)");
}

// `--commit-outage STEP`: once the attempt of STEP is open, the control plane goes away for
// three seconds (the file store's directory is moved aside; an etcd server this run may freeze
// (DCR_ETCD_PID) is stopped with SIGSTOP) and comes back.
void outage_thread(const simulate_settings& s, std::atomic<bool>& stop, std::atomic<bool>& done) {
  try {
    with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
      while (!stop.load()) {
        try {
          auto a = dcr::read_record<dcr::attempt_record>(plane, keys.attempt());
          if (a && a->value.key.target_version == static_cast<std::uint64_t>(s.commit_outage) &&
              a->value.state == dcr::attempt_state::open)
            break;
        } catch (const dcr::error&) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return 0;
    });
    if (stop.load()) return;
    if (uses_etcd(s)) {
      const char* pid = std::getenv("DCR_ETCD_PID");
      if (pid == nullptr) return;
      ::kill(static_cast<pid_t>(std::stol(pid)), SIGSTOP);
      std::this_thread::sleep_for(std::chrono::seconds(3));
      ::kill(static_cast<pid_t>(std::stol(pid)), SIGCONT);
    } else {
      const fs::path dir = plane_dir(s);
      const fs::path away = dir.string() + ".outage";
      fs::rename(dir, away);
      std::this_thread::sleep_for(std::chrono::seconds(3));
      fs::rename(away, dir);
    }
    done = true;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dcr simulate: outage injection failed: {}\n", e.what());
  }
}

/// The control plane's history after the run: PREFIX/history/<v> as the commit transactions
/// wrote them (each only if absent, so a version can be there once at most), by version, with
/// each record's store revision; and the commit record's version.
struct plane_history {
  std::map<std::uint64_t, std::pair<dcr::commit_record, std::int64_t>> versions;
  std::uint64_t committed = 0;
  std::vector<std::string> problems;  // a record under another version's key, or unreadable
};

plane_history read_history(const simulate_settings& s) {
  plane_history h;
  try {
    with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
      for (const auto& r : plane.list(keys.history_prefix())) {
        const auto c = dcr::decode_record<dcr::commit_record>(r.key, r.value);
        if (r.key != keys.history(c.version))
          h.problems.push_back(r.key + " holds version " + std::to_string(c.version));
        else
          h.versions[c.version] = {c, r.revision};
      }
      if (const auto c = dcr::read_record<dcr::commit_record>(plane, keys.commit())) h.committed = c->value.version;
      return 0;
    });
  } catch (const std::exception& e) {
    h.problems.push_back(std::string("cannot read the control plane's history: ") + e.what());
  }
  return h;
}

/// The kills that fired, from their markers (kill_marker: "<role>-<id>-<step>").
std::set<fired_kill> fired_kills(const fs::path& results) {
  std::set<fired_kill> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(results / "kills", ec)) {
    const std::string name = e.path().filename().string();
    const auto b = name.rfind('-');
    const auto a = b == std::string::npos || b == 0 ? std::string::npos : name.rfind('-', b - 1);
    if (a == std::string::npos) continue;
    out.insert({name.substr(0, a), std::stoi(name.substr(a + 1, b - a - 1)), std::stoll(name.substr(b + 1))});
  }
  return out;
}

}  // namespace

int run_simulate_agent(const simulate_settings& s) {
  try {
    if (s.role == "coordinator") return run_coordinator(s);
    if (s.role == "owner") return run_owner(s);
    if (s.role == "receiver") return run_receiver(s);
    if (s.role == "relay-root")
      return run_relay_root(s, [&](const dcr::payload_id& id) {
        return id.attempt.base_version != id.attempt.target_version &&
               kill_here(s, "relay-root", id.attempt.target_version);
      });
    fmt::print(stderr, "dcr simulate: unknown --role '{}'\n", s.role);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dcr simulate: {} {}: {}\n", s.role, s.id, e.what());
    return 1;
  }
}

int run_simulate_processes(const simulate_settings& settings) {
  simulate_settings s = settings;
  // A transport that refuses this run (S3: wrong credentials, no such bucket) stops it here,
  // before any process starts: nothing is written, nothing commits.
  check_transport(s);
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const dcr::sim::synthetic_trainer layout(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                           s.trainer_layout, dcr::sim::trainer_selection::none());
  const auto owners = owner_ids(layout);
  // --chaos: the schedule, drawn once who can be killed is known; the agents get it as flags.
  std::optional<chaos_plan> chaos;
  if (s.chaos_seed) {
    chaos = draw_chaos(*s.chaos_seed, s.steps,
                       s.chaos_kills >= 0 ? s.chaos_kills : default_chaos_kills(s.steps),
                       chaos_cast{s.receiver_tp, owners, uses_relay(s) ? s.relay_roots : 0});
    s.kills = chaos->kills();
    s.commit_outage = chaos->step_of("commit-outage");
    s.fault = "corrupt";
    s.fault_step = chaos->step_of("corrupt");
    fmt::print(s.json ? stderr : stdout, "{}", describe(*chaos));
    std::fflush(s.json ? stderr : stdout);
  }
  char tmpl[] = "/tmp/dcr-simulate-XXXXXX";
  DCR_EXPECTS(::mkdtemp(tmpl) != nullptr, dcr::errc::io_error, "dcr simulate: cannot make a work directory");
  s.workdir = tmpl;
  fs::create_directories(fs::path(s.workdir) / "results" / "kills");
  if (!uses_etcd(s)) dcr::file_control_plane::create(plane_dir(s));
  if (uses_relay(s)) {
    try {
      prepare_relay(s);
    } catch (...) {  // a relay that cannot be set up leaves no work directory behind
      std::error_code ec;
      fs::remove_all(s.workdir, ec);
      throw;
    }
  }
  const auto t0 = protocol_clock::now();

  std::vector<child> children;
  for (int k = 0; uses_relay(s) && k < s.relay_roots; ++k) children.push_back({"relay-root", k, true});
  children.push_back({"coordinator", 0});
  for (auto o : owners) children.push_back({"owner", static_cast<int>(o)});
  for (int r = 0; r < s.receiver_tp; ++r) children.push_back({"receiver", r});
  for (auto& c : children) {
    c.pid = spawn(child_args(s, c.role, c.id, false), c.service);
    c.running = true;
  }
  std::atomic<bool> stop_outage{false}, outage_done{false};
  std::thread outage;
  if (s.commit_outage >= 1) outage = std::thread(outage_thread, std::cref(s), std::ref(stop_outage), std::ref(outage_done));

  std::vector<child> finished;  // every process that ran, restarted ones included
  int failures = 0;
  const auto deadline = deadline_of(s) + std::chrono::seconds(30);
  bool services_stopped = false;
  while (std::any_of(children.begin(), children.end(), [](const child& c) { return c.running; })) {
    // The agents are done: the relay roots are told to stop.
    if (!services_stopped &&
        std::none_of(children.begin(), children.end(), [](const child& c) { return c.running && !c.service; })) {
      services_stopped = true;
      for (auto& c : children)
        if (c.running) ::kill(c.pid, SIGTERM);
    }
    int status = 0;
    rusage usage{};
    const pid_t pid = ::wait4(-1, &status, WNOHANG, &usage);
    if (pid <= 0) {
      if (protocol_clock::now() > deadline) {
        for (auto& c : children)
          if (c.running) ::kill(c.pid, SIGKILL);
        fmt::print(stderr, "dcr simulate: agents still running at the deadline; killed\n");
        ++failures;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    for (auto& c : children) {
      if (c.pid != pid || !c.running) continue;
      c.running = false;
      c.status = status;
      c.peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
      finished.push_back(c);
      const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      // Started again once per kill planned for it (each kill fires at most once).
      const auto planned = std::count_if(s.kills.begin(), s.kills.end(), [&](const kill_request& k) {
        return k.role == c.role && k.id == c.id;
      });
      if (killed && c.restarts < planned && !services_stopped) {
        c.pid = spawn(child_args(s, c.role, c.id, true), c.service);
        c.running = true;
        c.restarted = true;
        ++c.restarts;
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
                 !(c.service && services_stopped && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)) {
        ++failures;
        fmt::print(stderr, "dcr simulate: {} {} (pid {}) failed (status {})\n", c.role, c.id,
                   c.pid, status);
      }
    }
  }
  stop_outage = true;
  if (outage.joinable()) outage.join();
  const double total_seconds = std::chrono::duration<double>(protocol_clock::now() - t0).count();

  // ---- report
  const fs::path results = fs::path(s.workdir) / "results";
  const auto steps = read_lines(results / "coordinator-0.jsonl");
  std::map<std::uint64_t, std::vector<json>> receiver_lines, owner_lines;
  for (int r = 0; r < s.receiver_tp; ++r)
    for (auto& j : read_lines(results / ("receiver-" + std::to_string(r) + ".jsonl")))
      receiver_lines[j["step"].get<std::uint64_t>()].push_back(j);
  for (auto o : owners)
    for (auto& j : read_lines(results / ("owner-" + std::to_string(o) + ".jsonl")))
      owner_lines[j["step"].get<std::uint64_t>()].push_back(j);
  // Which device ran each stage, as the processes themselves report it.
  std::set<std::string> detect_devices, apply_devices;
  for (const auto& [step, lines] : owner_lines)
    for (const auto& o : lines)
      if (o.contains("devices")) detect_devices.insert(o["devices"]["detect"].get<std::string>());
  for (const auto& [step, lines] : receiver_lines)
    for (const auto& r : lines)
      if (r.contains("apply_device")) apply_devices.insert(r["apply_device"].get<std::string>());
  const std::string requested = dcr::exec::device_name(s.device);
  const std::string detect_on = joined(detect_devices, requested);
  const std::string apply_on = joined(apply_devices, requested);
  const json stage_devices{{"detect", detect_on},   {"project", detect_on},
                           {"tracker_update", detect_on}, {"residual", "cpu"},
                           {"encode", "cpu"},       {"compress", "cpu"},
                           {"decode", "cpu"},       {"apply", apply_on},
                           {"verify", "cpu"}};
  // Committed exactly once: the coordinator reported the step once, and the control plane's
  // history holds each version 1..steps once, for its own candidate, in commit order.
  const plane_history history = read_history(s);
  for (const auto& p : history.problems) fmt::print(stderr, "dcr simulate: history: {}\n", p);
  std::int64_t previous_revision = 0;
  std::set<std::uint64_t> committed_versions;
  bool all_ok = failures == 0 && static_cast<std::int64_t>(steps.size()) == s.steps;
  json report_steps = json::array();
  std::uint64_t fenced = 0, restores = 0;
  for (const auto& st : steps) {
    const auto step = st["step"].get<std::uint64_t>();
    const bool committed = st["committed"].get<bool>();
    const auto h = history.versions.find(step);
    const bool in_history = h != history.versions.end() &&
                            h->second.first.candidate == "step " + std::to_string(step) &&
                            h->second.second > previous_revision;
    if (in_history) previous_revision = h->second.second;
    const bool once = committed_versions.insert(step).second && in_history;
    // Every receiver reports the steps it held; all of them must be bit-exact, and every
    // receiver rank must have verified this step (a restarted one verifies after its restore).
    bool exact = committed && once;
    std::set<std::string> ranks;
    std::string mismatch;
    for (const auto& r : receiver_lines[step]) {
      exact = exact && r["bit_exact"].get<bool>();
      if (!r["bit_exact"].get<bool>()) mismatch = r["mismatch"].get<std::string>();
      ranks.insert(r["name"].get<std::string>());
      fenced += r["stale_refused"].get<std::uint64_t>();
    }
    restores += st["restores"].get<std::uint64_t>();
    std::set<std::string> expected_ranks;
    for (int r = 0; r < s.receiver_tp; ++r) expected_ranks.insert("r" + std::to_string(r));
    exact = exact && ranks == expected_ranks;
    all_ok = all_ok && exact;
    std::uint64_t bytes = 0, payloads = 0, changed = 0, refetched = 0;
    double build = 0, compress = 0, apply = 0, fetch = 0;
    json failures_list = json::array();
    for (const auto& a : st["attempts"]) {
      if (!a["failure"].get<std::string>().empty()) failures_list.push_back(a["failure"]);
      for (const auto& r : a["reports"]) {
        bytes += r["payload_bytes"].get<std::uint64_t>();
        payloads += r["payloads"].get<std::uint64_t>();
        if (a["committed"].get<bool>()) {
          changed += r["changed_elements"].get<std::uint64_t>();
          build = std::max(build, r["build_seconds"].get<double>());
          compress = std::max(compress, r["compress_seconds"].get<double>() + r["put_seconds"].get<double>());
        }
      }
      for (const auto& k : a["acks"]) refetched += k.value("refetched", std::uint64_t{0});
      if (a["committed"].get<bool>())
        for (const auto& k : a["acks"]) {
          apply = std::max(apply, k["apply_seconds"].get<double>());
          fetch = std::max(fetch, k["fetch_seconds"].get<double>());
        }
    }
    // Cross-cluster flows: the bytes every process moved over each node's flow this step; the
    // busiest flow's booked time is the step's transport lower bound.
    std::map<std::string, std::uint64_t> flows;
    for (const auto* lines : {&owner_lines[step], &receiver_lines[step]})
      for (const auto& line : *lines)
        if (line.contains("flows"))
          for (const auto& [name, b] : line["flows"].items()) flows[name] += b.get<std::uint64_t>();
    std::uint64_t crossing = 0, busiest = 0;
    for (const auto& [name, b] : flows) {
      crossing += b;
      busiest = std::max(busiest, b);
    }
    const json transport_seconds =
        s.link_rate > 0 ? json(static_cast<double>(busiest) / s.link_rate) : json(nullptr);
    json one{{"step", step}, {"committed", committed}, {"committed_once", once},
             {"bit_exact", exact}, {"attempts", st["attempts"].size()},
             {"payloads", payloads}, {"payload_bytes", bytes}, {"changed_elements", changed},
             {"refetched", refetched},
             {"restores", st["restores"]}, {"committed_by_other", st["committed_by_other"]},
             {"seconds", {{"total", st["seconds"]}, {"commit", st["commit_seconds"]},
                          {"build", build}, {"compress_put", compress}, {"fetch", fetch},
                          {"apply", apply},
                          {"waiting_for_candidates", st.value("wait_seconds", 0.0)},
                          {"cleanup", st.value("cleanup_seconds", 0.0)},
                          {"transport", transport_seconds}}},
             {"bytes_crossing", crossing}, {"flows", flows},
             {"failures", failures_list}};
    one["history"] = h == history.versions.end()
                         ? json(nullptr)
                         : json{{"attempt", h->second.first.attempt}, {"revision", h->second.second},
                                {"candidate", h->second.first.candidate}};
    if (!mismatch.empty()) one["mismatch"] = mismatch;
    if (!owner_lines[step].empty()) {
      json timelines = json::array();
      for (const auto& o : owner_lines[step])
        timelines.push_back({{"owner", o["report"]["owner"]}, {"timeline", o["timeline"]}});
      one["owner_timelines"] = timelines;
      one["begin_unix"] = st["begin_unix"];
      one["end_unix"] = st["end_unix"];
    }
    {
      json timelines = json::array();
      for (const auto& r : receiver_lines[step])
        if (r.contains("timeline"))
          timelines.push_back({{"receiver", r["name"]}, {"timeline", r["timeline"]}});
      one["receiver_timelines"] = timelines;
    }
    report_steps.push_back(one);
  }
  const bool history_exact = history.problems.empty() &&
                             history.versions.size() == static_cast<std::size_t>(s.steps) &&
                             history.committed == static_cast<std::uint64_t>(s.steps);
  all_ok = all_ok && history_exact;
  const json history_json{{"versions", history.versions.size()}, {"commit_version", history.committed},
                          {"exactly_once", history_exact}, {"problems", history.problems}};
  // Every --kill must have happened: a recovery test whose kill never fired proves nothing.
  const auto fired = fired_kills(results);
  json kills_json = json::array();
  for (const auto& k : s.kills) {
    const bool happened = fired.count({k.role, k.id, k.step}) > 0;
    kills_json.push_back({{"role", k.role}, {"id", k.id}, {"step", k.step}, {"fired", happened}});
    if (!happened)
      fmt::print(stderr, "dcr simulate: --kill {}/{}:{} never fired (the process did not reach that point of step {})\n",
                 k.role, k.id, k.step, k.step);
    all_ok = all_ok && happened;
  }
  std::optional<json> chaos_json;
  if (chaos) chaos_json = chaos_figures(*chaos, report_steps, fired, outage_done.load());
  const bool chaos_ok = !chaos_json || (*chaos_json)["ok"].get<bool>();
  json processes = json::array();
  for (const auto& c : finished)
    processes.push_back({{"role", c.role}, {"id", c.id}, {"pid", c.pid}, {"restarted", c.restarted},
                         {"peak_rss_bytes", c.peak_rss_bytes},
                         {"exit", WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -WTERMSIG(c.status)}});
  const auto checkpoint_bytes = static_cast<std::uint64_t>(registry.total_bytes());
  // The reference on the same flows, after every agent has finished (nothing else runs).
  std::optional<reference_result> reference;
  if (s.reference) {
    reference = run_reference(s, static_cast<std::uint64_t>(s.steps));
    for (auto& st : report_steps) {
      const double total = st["seconds"]["total"].get<double>();
      st["speedup_over_reference"] = total > 0 ? reference->seconds / total : 0.0;
    }
  }
  if (s.json) {
    json out{{"mode", "processes"}, {"checkpoint_bytes", checkpoint_bytes},
             {"canonical_tensors", registry.size()}, {"commit", uses_etcd(s) ? s.commit : "file"},
             {"asynchronous", s.asynchronous}, {"pipelined", s.pipelined},
             {"transport", s.transport}, {"store", transport_description(s)},
             {"s3_fanout", s.s3_fanout}, {"link_rate", s.link_rate},
             {"trainer_nodes", s.trainer_nodes}, {"rollout_nodes", s.rollout_nodes},
             {"steps", report_steps}, {"processes", processes}, {"restores", restores},
             {"fenced_payloads", fenced}, {"commit_outage_injected", outage_done.load()},
             {"seconds", total_seconds},
             {"device", {{"requested", requested}, {"description", s.device_description}}},
             {"stage_devices", stage_devices}, {"history", history_json}, {"kills", kills_json},
             {"all_bit_exact", all_ok}};
    if (chaos_json) out["chaos"] = *chaos_json;
    if (reference)
      out["reference"] = {{"seconds", reference->seconds},
                          {"upload_seconds", reference->upload_seconds},
                          {"download_seconds", reference->download_seconds},
                          {"checkpoint_bytes", reference->checkpoint_bytes},
                          {"bytes_crossing", reference->bytes_crossing},
                          {"transport_seconds", reference->transport_seconds}};
    if (uses_relay(s)) {
      json roots = json::array();
      for (int k = 0; k < s.relay_roots; ++k)
        for (auto& j : read_lines(results / ("relay-root-" + std::to_string(k) + ".jsonl"))) {
          j["root"] = k;
          roots.push_back(j);
        }
      out["relay"] = {{"roots", s.relay_roots}, {"flows_per_root", s.relay_flows},
                      {"port_base", s.relay_port_base}, {"root_counters", roots}};
    }
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("dcr simulate: {} processes (1 coordinator, {} owners, {} receivers{}), {:.1f} MB "
               "checkpoint, control plane {}, {}\n",
               children.size(), owners.size(), s.receiver_tp,
               uses_relay(s) ? fmt::format(", {} relay roots", s.relay_roots) : std::string(),
               checkpoint_bytes / 1e6, uses_etcd(s) ? s.commit : plane_dir(s),
               uses_relay(s) ? fmt::format("relay on 127.0.0.1:{}.., certificates {}", s.relay_port_base, s.relay_certs)
                             : "payload store " + transport_description(s) + (s.s3_fanout ? " (fan-out)" : ""));
    fmt::print("  device {}: detect, project, tracker update on {}; apply on {}; residual, "
               "encode, compress, decode, verify on cpu\n",
               s.device_description, detect_on, apply_on);
    for (const auto& st : report_steps)
      fmt::print("step {:>3}: {:>11} changed  {:>12} payload bytes  {} attempt(s)  {:.3f} s  {}{}\n",
                 st["step"].get<std::uint64_t>(), st["changed_elements"].get<std::uint64_t>(),
                 st["payload_bytes"].get<std::uint64_t>(), st["attempts"].get<std::size_t>(),
                 st["seconds"]["total"].get<double>(),
                 st["bit_exact"].get<bool>() ? "bit-exact" : "MISMATCH",
                 st["failures"].empty() ? std::string() : "  (retried after: " + st["failures"][0].get<std::string>() + ")");
    for (const auto& p : processes)
      fmt::print("  {:<12} {:>2}  pid {:>7}  peak RSS {:>8.1f} MB{}\n", p["role"].get<std::string>(),
                 p["id"].get<int>(), p["pid"].get<int>(), p["peak_rss_bytes"].get<std::uint64_t>() / 1e6,
                 p["restarted"].get<bool>() ? "  (restarted)" : "");
    if (reference)
      fmt::print("  reference (full checkpoint through object storage): {:.3f} s (upload {:.3f} s, "
                 "download {:.3f} s), {:.1f} MB crossing\n",
                 reference->seconds, reference->upload_seconds, reference->download_seconds,
                 reference->bytes_crossing / 1e6);
    if (chaos_json) fmt::print("{}", describe_figures(*chaos_json));
    fmt::print("  result: {}\n", all_ok ? "every step committed once and bit-exact"
                                        : "NOT every step committed once and bit-exact");
  }
  if (!s.keep) {
    try {
      clean_transport(s);
    } catch (const dcr::error& e) {
      fmt::print(stderr, "dcr simulate: could not erase the run's payloads: {}\n", e.what());
    }
    std::error_code ec;
    fs::remove_all(s.workdir, ec);
  } else {
    fmt::print(stderr, "dcr simulate: kept {}\n", s.workdir);
  }
  return all_ok && chaos_ok ? 0 : 1;
}

}  // namespace dcr_tool
