// tools/dcr/simulate_agents.hpp: what the processes of `dcr simulate` share (tool-internal):
// the parent (simulate_processes.cpp) and the three agents it starts, each in a translation unit
// of its own (simulate_agent_coordinator.cpp, simulate_agent_owner.cpp,
// simulate_agent_receiver.cpp over simulate_agent_receiver.hpp), so that no unit instantiates
// every agent over every control plane and transport.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcr/protocol/agent_support.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"
#include "dcr/protocol/plane/file_control_plane.hpp"
#include "dcr/protocol/records.hpp"
#include "dcr/sim/moe_model.hpp"
#include "simulate_processes.hpp"

namespace dcr_tool {

namespace fs = std::filesystem;
using json = nlohmann::json;
using dcr::protocol_clock;

inline protocol_clock::time_point deadline_of(const simulate_settings& s) {
  return protocol_clock::now() +
         std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_seconds * 1000));
}

inline std::string plane_dir(const simulate_settings& s) {
  if (s.commit.rfind("file:", 0) == 0) return s.commit.substr(5);
  return (fs::path(s.workdir) / "control").string();
}
/// Stage spans as JSON (what scripts/protocol-timeline.py draws).
inline json timeline_json(const std::vector<dcr::stage_span>& spans) {
  json out = json::array();
  for (const auto& span : spans)
    out.push_back({{"stage", span.stage}, {"begin", span.begin}, {"end", span.end}});
  return out;
}

inline bool uses_etcd(const simulate_settings& s) { return s.commit.rfind("etcd", 0) == 0; }

/// "cuda", "cpu", or "cpu+cuda" when processes disagree (they do not; a report would show it).
inline std::string joined(const std::set<std::string>& names, const std::string& fallback) {
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
inline fs::path kill_marker(const simulate_settings& s, const std::string& role, std::uint64_t step) {
  return fs::path(s.workdir) / "results" / "kills" / fmt::format("{}-{}-{}", role, s.id, step);
}

/// Whether to SIGKILL this process now: a --kill names its role, id and the step `target`, and
/// has not fired yet. The first caller creates the kill's marker (O_EXCL), so the process
/// started again after it (or another thread) never fires the same kill twice, while a later
/// kill of the same process still fires; the parent reads the markers to count the kills.
inline bool kill_here(const simulate_settings& s, const char* role, std::uint64_t target) {
  for (const auto& k : s.kills)
    if (k.role == role && k.id == s.id && static_cast<std::uint64_t>(k.step) == target) {
      const int fd = ::open(kill_marker(s, role, target).c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
      if (fd < 0) return false;  // fired before (or unmarkable: then it never fires, so never twice)
      ::close(fd);
      return true;
    }
  return false;
}

inline void append_line(const simulate_settings& s, const json& j) {
  const auto path = fs::path(s.workdir) / "results" / (s.role + "-" + std::to_string(s.id) + ".jsonl");
  std::ofstream out(path, std::ios::app);
  out << j.dump() << "\n";
}

inline std::vector<std::uint32_t> owner_ids(const dcr::sim::synthetic_trainer& t) {
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

// The agents, one process each (`--role coordinator|owner|receiver`); each returns the
// process's exit status.
int run_coordinator(const simulate_settings& s);
int run_owner(const simulate_settings& s);
int run_receiver(const simulate_settings& s);

}  // namespace dcr_tool
