// tools/dcr/simulate_chaos.hpp: `dcr simulate --chaos SEED`, a reproducible schedule of
// disruptions drawn from a seed (kills of every role at random steps, one control-plane outage,
// one corrupted payload) and the figures of the run that survived them (docs/simulate.md).
//
// The parent draws the schedule once it knows who can be killed (which owner ids exist, how
// many receivers and relay roots run) and hands it to the agents as the plain flags `--kill`,
// `--commit-outage` and `--fault corrupt --fault-step`, so an agent of a chaos run behaves
// exactly as one given those flags by hand. This unit holds only the schedule and the
// arithmetic over the report; it starts nothing.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace dcr_tool {

/// A process to SIGKILL in the middle of a step (`--kill ROLE[/ID]:STEP`).
struct kill_request {
  std::string role;  ///< receiver, owner, coordinator or relay-root
  int id = 0;        ///< which receiver rank, owner id or relay root (0 by default)
  std::int64_t step = 0;
  friend auto operator<=>(const kill_request&, const kill_request&) = default;
};

/// One disruption of a chaos run.
struct chaos_event {
  std::int64_t step = 0;
  std::string kind;   ///< "kill", "commit-outage" or "corrupt"
  kill_request kill;  ///< for kind "kill": whom (kill.step == step)
};

/// Who a chaos run can kill: receiver ranks [0, receivers), these owner ids, relay roots
/// [0, relay_roots) (0: no relay, no relay-root kills), and the coordinator.
struct chaos_cast {
  int receivers = 0;
  std::vector<std::uint32_t> owners;
  int relay_roots = 0;
};

/// A drawn schedule: at most one event per step, none at step 1 (the first step is the
/// baseline every later one is compared with, and every process is fresh).
struct chaos_plan {
  std::uint64_t seed = 0;
  int kills_per_role = 0;
  std::vector<chaos_event> events;  ///< sorted by step
  [[nodiscard]] std::vector<kill_request> kills() const;
  [[nodiscard]] std::int64_t step_of(const std::string& kind) const;  ///< -1 if none
  [[nodiscard]] const chaos_event* at(std::int64_t step) const;      ///< nullptr if none
};

/// The kills per role a run of `steps` steps gets when --chaos-kills is not given: one per
/// eight steps, at least one.
int default_chaos_kills(std::int64_t steps);

/// Draws the schedule from `seed` alone (std::mt19937_64, whose output the standard fixes, and
/// no distribution objects, whose output it does not): `kills_per_role` kills of each role in
/// `cast` (the victim's id drawn too), one commit outage and one corrupted payload (receiver
/// rank 0's first payload of that step), each on a step of its own among 2..steps. Throws
/// dcr::error(invalid_argument) when the steps cannot hold them all.
chaos_plan draw_chaos(std::uint64_t seed, std::int64_t steps, int kills_per_role,
                      const chaos_cast& cast);

/// The schedule, one event per line ("step  7  kill owner/1").
std::string describe(const chaos_plan& plan);

/// A kill that fired: (role, id, step), as the agents mark them in WORKDIR/results/kills/.
using fired_kill = std::tuple<std::string, int, std::int64_t>;

/// The chaos figures of a finished run, from the report's steps (the JSON objects
/// run_simulate_processes builds: step, committed_once, bit_exact, attempts, refetched,
/// failures, end_unix), the kills that fired and whether the outage was injected:
/// `schedule`, per role `planned` / `fired` / `survived`, `attempts_per_step`, the median
/// commit-to-commit period of clean steps (no event, one attempt), and per event its step's
/// attempts, period and `seconds_lost` (the period minus that median). A kill survived when
/// it fired and its step committed once, bit-exact. `ok`: every kill fired and survived, the
/// outage was injected, the corrupted payload was refused (fetched again, or its attempt
/// failed and was retried) and its step still committed once and bit-exact.
nlohmann::json chaos_figures(const chaos_plan& plan, const nlohmann::json& steps,
                             const std::set<fired_kill>& fired, bool outage_injected);

/// The human report's chaos lines (what chaos_figures says, a line per role and per event).
std::string describe_figures(const nlohmann::json& figures);

}  // namespace dcr_tool
