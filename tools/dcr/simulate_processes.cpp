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
// The agents themselves are in simulate_agent_{coordinator,owner,receiver}.cpp.
#include "simulate_processes.hpp"
#include "simulate_agents.hpp"

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
#include "dcr/sim/moe_model.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "simulate_reference.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {
namespace {

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

namespace {

/// Before any agent starts: with --chaos, the drawn schedule becomes the run's kills, outage and
/// corrupted payload (printed); the work directory, the file control plane and, with the relay,
/// its ports and TLS files. Returns the chaos schedule (none without --chaos).
std::optional<chaos_plan> prepare_run(simulate_settings& s, const std::vector<std::uint32_t>& owners) {
  std::optional<chaos_plan> chaos;
  // --chaos: the schedule, drawn once who can be killed is known; the agents get it as flags.
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
  return chaos;
}

/// What supervising the agent processes gave.
struct supervision {
  std::vector<child> finished;  ///< every process that ran, restarted ones included
  int failures = 0;             ///< processes that failed (or ran past the deadline)
  std::size_t processes = 0;    ///< processes started (restarts not counted)
  bool outage_injected = false;
  double seconds = 0;           ///< first start to last exit
};

/// Starts the relay roots, the coordinator, every owner and every receiver; restarts each
/// process once per kill planned for it; injects the --commit-outage; stops the relay roots
/// once the agents are done; kills everything at the deadline.
supervision supervise_agents(const simulate_settings& s, const std::vector<std::uint32_t>& owners) {
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

  supervision out;
  auto& finished = out.finished;
  int& failures = out.failures;
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

  out.processes = children.size();
  out.outage_injected = outage_done.load();
  out.seconds = std::chrono::duration<double>(protocol_clock::now() - t0).count();
  return out;
}

/// The agents' lines of each step (results/<role>-<id>.jsonl), by step.
struct agent_lines {
  std::vector<json> coordinator;                             ///< one line per step, in order
  std::map<std::uint64_t, std::vector<json>> receivers, owners;
};

agent_lines read_agent_lines(const simulate_settings& s, const std::vector<std::uint32_t>& owners) {
  const fs::path results = fs::path(s.workdir) / "results";
  agent_lines out;
  out.coordinator = read_lines(results / "coordinator-0.jsonl");
  for (int r = 0; r < s.receiver_tp; ++r)
    for (auto& j : read_lines(results / ("receiver-" + std::to_string(r) + ".jsonl")))
      out.receivers[j["step"].get<std::uint64_t>()].push_back(j);
  for (auto o : owners)
    for (auto& j : read_lines(results / ("owner-" + std::to_string(o) + ".jsonl")))
      out.owners[j["step"].get<std::uint64_t>()].push_back(j);
  return out;
}

/// Which device ran each stage, as the processes themselves report it.
struct stage_devices {
  std::string requested, detect, apply;
  [[nodiscard]] json to_json() const {
    return {{"detect", detect}, {"project", detect},   {"tracker_update", detect},
            {"residual", "cpu"}, {"encode", "cpu"},    {"compress", "cpu"},
            {"decode", "cpu"},   {"apply", apply},     {"verify", "cpu"}};
  }
};

stage_devices stage_devices_of(const simulate_settings& s, agent_lines& lines) {
  std::set<std::string> detect_devices, apply_devices;
  for (const auto& [step, owner_lines] : lines.owners)
    for (const auto& o : owner_lines)
      if (o.contains("devices")) detect_devices.insert(o["devices"]["detect"].get<std::string>());
  for (const auto& [step, receiver_lines] : lines.receivers)
    for (const auto& r : receiver_lines)
      if (r.contains("apply_device")) apply_devices.insert(r["apply_device"].get<std::string>());
  stage_devices d;
  d.requested = dcr::exec::device_name(s.device);
  d.detect = joined(detect_devices, d.requested);
  d.apply = joined(apply_devices, d.requested);
  return d;
}

/// The steps as the report lists them, and whether each committed exactly once and bit-exact.
struct step_reports {
  json steps = json::array();
  bool all_ok = true;
  std::uint64_t fenced = 0, restores = 0;
};

/// One step's report from the coordinator's line `st`, the agents' lines of that step and the
/// control plane's history; `previous_revision` is the last committed version's revision
/// (committed in order: each step's must be later). Its "bit_exact" says whether it committed
/// once and every receiver rank verified it bit-exact.
json step_report(const simulate_settings& s, const json& st, agent_lines& lines,
                 const plane_history& history, std::int64_t& previous_revision,
                 std::set<std::uint64_t>& committed_versions, step_reports& totals) {
  const auto step = st["step"].get<std::uint64_t>();
  const bool committed = st["committed"].get<bool>();
  // Committed exactly once: the coordinator reported the step once, and the control plane's
  // history holds it once, for its own candidate, after the step before.
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
  for (const auto& r : lines.receivers[step]) {
    exact = exact && r["bit_exact"].get<bool>();
    if (!r["bit_exact"].get<bool>()) mismatch = r["mismatch"].get<std::string>();
    ranks.insert(r["name"].get<std::string>());
    totals.fenced += r["stale_refused"].get<std::uint64_t>();
  }
  totals.restores += st["restores"].get<std::uint64_t>();
  std::set<std::string> expected_ranks;
  for (int r = 0; r < s.receiver_tp; ++r) expected_ranks.insert("r" + std::to_string(r));
  exact = exact && ranks == expected_ranks;
  std::uint64_t bytes = 0, payloads = 0, changed = 0, refetched = 0;
  double build = 0, compress = 0, apply = 0, fetch = 0;
  json failures_list = json::array();
  for (const auto& a : st["attempts"]) {
    if (!a["failure"].get<std::string>().empty()) failures_list.push_back(a["failure"]);
    for (const auto& r : a["reports"]) {
      bytes += r["payload_bytes"].get<std::uint64_t>();
      payloads += r["payloads"].get<std::uint64_t>();
      if (a["committed"].get<bool>()) {
        changed += r["stats"]["changed_elements"].get<std::uint64_t>();
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
  for (const auto* agent : {&lines.owners[step], &lines.receivers[step]})
    for (const auto& line : *agent)
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
           {"seconds", {{"refit", st["seconds"]}, {"commit", st["commit_seconds"]},
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
  if (!lines.owners[step].empty()) {
    json timelines = json::array();
    for (const auto& o : lines.owners[step])
      timelines.push_back({{"owner", o["report"]["owner"]}, {"timeline", o["timeline"]}});
    one["owner_timelines"] = timelines;
    one["begin_unix"] = st["begin_unix"];
    one["end_unix"] = st["end_unix"];
  }
  json timelines = json::array();
  for (const auto& r : lines.receivers[step])
    if (r.contains("timeline")) timelines.push_back({{"receiver", r["name"]}, {"timeline", r["timeline"]}});
  one["receiver_timelines"] = timelines;
  return one;
}

step_reports report_steps_of(const simulate_settings& s, agent_lines& lines, const plane_history& history) {
  step_reports out;
  std::int64_t previous_revision = 0;
  std::set<std::uint64_t> committed_versions;
  out.all_ok = static_cast<std::int64_t>(lines.coordinator.size()) == s.steps;
  for (const auto& st : lines.coordinator) {
    out.steps.push_back(step_report(s, st, lines, history, previous_revision, committed_versions, out));
    out.all_ok = out.all_ok && out.steps.back()["bit_exact"].get<bool>();
  }
  return out;
}

/// Whether the control plane's history holds every version once, and its figures.
json history_report(const simulate_settings& s, const plane_history& history, bool& exact) {
  exact = history.problems.empty() && history.versions.size() == static_cast<std::size_t>(s.steps) &&
          history.committed == static_cast<std::uint64_t>(s.steps);
  return {{"versions", history.versions.size()}, {"commit_version", history.committed},
          {"exactly_once", exact}, {"problems", history.problems}};
}

/// Every --kill must have happened: a recovery test whose kill never fired proves nothing.
json kills_report(const simulate_settings& s, const std::set<fired_kill>& fired, bool& all_fired) {
  all_fired = true;
  json out = json::array();
  for (const auto& k : s.kills) {
    const bool happened = fired.count({k.role, k.id, k.step}) > 0;
    out.push_back({{"role", k.role}, {"id", k.id}, {"step", k.step}, {"fired", happened}});
    if (!happened)
      fmt::print(stderr, "dcr simulate: --kill {}/{}:{} never fired (the process did not reach that point of step {})\n",
                 k.role, k.id, k.step, k.step);
    all_fired = all_fired && happened;
  }
  return out;
}

json processes_report(const supervision& run) {
  json out = json::array();
  for (const auto& c : run.finished)
    out.push_back({{"role", c.role}, {"id", c.id}, {"pid", c.pid}, {"restarted", c.restarted},
                   {"peak_rss_bytes", c.peak_rss_bytes},
                   {"exit", WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -WTERMSIG(c.status)}});
  return out;
}

/// What the report of a run says, gathered.
struct run_report {
  std::uint64_t checkpoint_bytes = 0;
  std::size_t canonical_tensors = 0, owners = 0;
  const supervision* run = nullptr;
  stage_devices devices;
  step_reports steps;
  json processes, history, kills;
  std::optional<json> chaos;
  std::optional<reference_result> reference;
  bool all_ok = false;
};

void print_json_report(const simulate_settings& s, const run_report& r) {
  json out{{"mode", "processes"}, {"checkpoint_bytes", r.checkpoint_bytes},
           {"canonical_tensors", r.canonical_tensors}, {"commit", uses_etcd(s) ? s.commit : "file"},
           {"asynchronous", s.asynchronous}, {"pipelined", s.pipelined},
           {"owner_threads", s.owner_threads},
           {"transport", s.transport}, {"store", transport_description(s)},
           {"s3_fanout", s.s3_fanout}, {"link_rate", s.link_rate},
           {"trainer_nodes", s.trainer_nodes}, {"rollout_nodes", s.rollout_nodes},
           {"steps", r.steps.steps}, {"processes", r.processes}, {"restores", r.steps.restores},
           {"fenced_payloads", r.steps.fenced}, {"commit_outage_injected", r.run->outage_injected},
           {"seconds", r.run->seconds},
           {"device", {{"requested", r.devices.requested}, {"description", s.device_description}}},
           {"stage_devices", r.devices.to_json()}, {"history", r.history}, {"kills", r.kills},
           {"all_bit_exact", r.all_ok}};
  if (r.chaos) out["chaos"] = *r.chaos;
  if (r.reference)
    out["reference"] = {{"seconds", r.reference->seconds},
                        {"upload_seconds", r.reference->upload_seconds},
                        {"download_seconds", r.reference->download_seconds},
                        {"checkpoint_bytes", r.reference->checkpoint_bytes},
                        {"bytes_crossing", r.reference->bytes_crossing},
                        {"transport_seconds", r.reference->transport_seconds}};
  if (uses_relay(s)) {
    const fs::path results = fs::path(s.workdir) / "results";
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
}

void print_human_report(const simulate_settings& s, const run_report& r) {
  fmt::print("dcr simulate: {} processes (1 coordinator, {} owners, {} receivers{}), {:.1f} MB "
             "checkpoint, control plane {}, {}\n",
             r.run->processes, r.owners, s.receiver_tp,
             uses_relay(s) ? fmt::format(", {} relay roots", s.relay_roots) : std::string(),
             r.checkpoint_bytes / 1e6, uses_etcd(s) ? s.commit : plane_dir(s),
             uses_relay(s) ? fmt::format("relay on 127.0.0.1:{}.., certificates {}", s.relay_port_base, s.relay_certs)
                           : "payload store " + transport_description(s) + (s.s3_fanout ? " (fan-out)" : ""));
  fmt::print("  device {}: detect, project, tracker update on {}; apply on {}; residual, "
             "encode, compress, decode, verify on cpu\n",
             s.device_description, r.devices.detect, r.devices.apply);
  for (const auto& st : r.steps.steps)
    fmt::print("step {:>3}: {:>11} changed  {:>12} payload bytes  {} attempt(s)  refit {:.3f} s"
               "  (candidates {:.3f} s)  {}{}\n",
               st["step"].get<std::uint64_t>(), st["changed_elements"].get<std::uint64_t>(),
               st["payload_bytes"].get<std::uint64_t>(), st["attempts"].get<std::size_t>(),
               st["seconds"]["refit"].get<double>(),
               st["seconds"]["waiting_for_candidates"].get<double>(),
               st["bit_exact"].get<bool>() ? "bit-exact" : "MISMATCH",
               st["failures"].empty() ? std::string() : "  (retried after: " + st["failures"][0].get<std::string>() + ")");
  for (const auto& p : r.processes)
    fmt::print("  {:<12} {:>2}  pid {:>7}  peak RSS {:>8.1f} MB{}\n", p["role"].get<std::string>(),
               p["id"].get<int>(), p["pid"].get<int>(), p["peak_rss_bytes"].get<std::uint64_t>() / 1e6,
               p["restarted"].get<bool>() ? "  (restarted)" : "");
  if (r.reference)
    fmt::print("  reference (full checkpoint through object storage): {:.3f} s (upload {:.3f} s, "
               "download {:.3f} s), {:.1f} MB crossing\n",
               r.reference->seconds, r.reference->upload_seconds, r.reference->download_seconds,
               r.reference->bytes_crossing / 1e6);
  if (r.chaos) fmt::print("{}", describe_figures(*r.chaos));
  fmt::print("  result: {}\n", r.all_ok ? "every step committed once and bit-exact"
                                        : "NOT every step committed once and bit-exact");
}

/// Erases the run's payloads and work directory, unless --keep.
void clean_up(const simulate_settings& s) {
  if (s.keep) {
    fmt::print(stderr, "dcr simulate: kept {}\n", s.workdir);
    return;
  }
  try {
    clean_transport(s);
  } catch (const dcr::error& e) {
    fmt::print(stderr, "dcr simulate: could not erase the run's payloads: {}\n", e.what());
  }
  std::error_code ec;
  fs::remove_all(s.workdir, ec);
}

}  // namespace

int run_simulate_processes(const simulate_settings& settings) {
  simulate_settings s = settings;
  // A transport that refuses this run (S3: wrong credentials, no such bucket) stops it here,
  // before any process starts: nothing is written, nothing commits.
  check_transport(s);
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const dcr::sim::synthetic_trainer layout(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                           s.trainer_layout, dcr::sim::trainer_selection::none());
  const auto owners = owner_ids(layout);
  const std::optional<chaos_plan> chaos = prepare_run(s, owners);
  const supervision run = supervise_agents(s, owners);

  run_report r;
  r.checkpoint_bytes = static_cast<std::uint64_t>(registry.total_bytes());
  r.canonical_tensors = registry.size();
  r.owners = owners.size();
  r.run = &run;
  agent_lines lines = read_agent_lines(s, owners);
  r.devices = stage_devices_of(s, lines);
  const plane_history history = read_history(s);
  for (const auto& p : history.problems) fmt::print(stderr, "dcr simulate: history: {}\n", p);
  r.steps = report_steps_of(s, lines, history);
  bool history_exact = false, all_fired = false;
  r.history = history_report(s, history, history_exact);
  const auto fired = fired_kills(fs::path(s.workdir) / "results");
  r.kills = kills_report(s, fired, all_fired);
  r.all_ok = run.failures == 0 && r.steps.all_ok && history_exact && all_fired;
  if (chaos) r.chaos = chaos_figures(*chaos, r.steps.steps, fired, run.outage_injected);
  const bool chaos_ok = !r.chaos || (*r.chaos)["ok"].get<bool>();
  r.processes = processes_report(run);
  // The reference on the same flows, after every agent has finished (nothing else runs).
  if (s.reference) {
    r.reference = run_reference(s, static_cast<std::uint64_t>(s.steps));
    for (auto& st : r.steps.steps) {
      const double refit = st["seconds"]["refit"].get<double>();
      st["speedup_over_reference"] = refit > 0 ? r.reference->seconds / refit : 0.0;
    }
  }
  if (s.json)
    print_json_report(s, r);
  else
    print_human_report(s, r);
  clean_up(s);
  return r.all_ok && chaos_ok ? 0 : 1;
}

}  // namespace dcr_tool
