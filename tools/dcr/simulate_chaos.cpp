// tools/dcr/simulate_chaos.cpp: the chaos schedule and its figures (see simulate_chaos.hpp).
#include "simulate_chaos.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>

#include "dcr/error.hpp"

namespace dcr_tool {

using json = nlohmann::json;

std::vector<kill_request> chaos_plan::kills() const {
  std::vector<kill_request> out;
  for (const auto& e : events)
    if (e.kind == "kill") out.push_back(e.kill);
  return out;
}

std::int64_t chaos_plan::step_of(const std::string& kind) const {
  for (const auto& e : events)
    if (e.kind == kind) return e.step;
  return -1;
}

const chaos_event* chaos_plan::at(std::int64_t step) const {
  for (const auto& e : events)
    if (e.step == step) return &e;
  return nullptr;
}

int default_chaos_kills(std::int64_t steps) {
  return static_cast<int>(std::max<std::int64_t>(1, steps / 8));
}

chaos_plan draw_chaos(std::uint64_t seed, std::int64_t steps, int kills_per_role,
                      const chaos_cast& cast) {
  DCR_EXPECTS(kills_per_role >= 0, dcr::errc::invalid_argument,
              "--chaos-kills must be >= 0, got " + std::to_string(kills_per_role));
  std::mt19937_64 rng(seed);
  // A draw in [0, n): the modulo's bias is far below anything a schedule could show.
  auto below = [&](std::uint64_t n) { return rng() % n; };
  chaos_plan plan;
  plan.seed = seed;
  plan.kills_per_role = kills_per_role;
  auto add_kills = [&](const std::string& role, auto draw_id) {
    for (int i = 0; i < kills_per_role; ++i) {
      chaos_event e;
      e.kind = "kill";
      e.kill.role = role;
      e.kill.id = draw_id();
      plan.events.push_back(e);
    }
  };
  if (cast.receivers > 0)
    add_kills("receiver", [&] { return static_cast<int>(below(static_cast<std::uint64_t>(cast.receivers))); });
  if (!cast.owners.empty())
    add_kills("owner", [&] { return static_cast<int>(cast.owners[below(cast.owners.size())]); });
  add_kills("coordinator", [] { return 0; });
  if (cast.relay_roots > 0)
    add_kills("relay-root", [&] { return static_cast<int>(below(static_cast<std::uint64_t>(cast.relay_roots))); });
  plan.events.push_back({0, "commit-outage", {}});
  plan.events.push_back({0, "corrupt", {}});

  const auto slots = std::max<std::int64_t>(0, steps - 1);  // steps 2..steps
  DCR_EXPECTS(static_cast<std::int64_t>(plan.events.size()) <= slots, dcr::errc::invalid_argument,
              fmt::format("--chaos: {} events ({} kills per role, an outage, a corrupted payload) "
                          "need at least {} steps (one event per step, none at step 1); --steps is {}",
                          plan.events.size(), kills_per_role, plan.events.size() + 1, steps));
  std::vector<std::int64_t> free_steps;
  for (std::int64_t k = 2; k <= steps; ++k) free_steps.push_back(k);
  // A partial Fisher-Yates shuffle: event i takes the i-th of the shuffled steps.
  for (std::size_t i = 0; i < plan.events.size(); ++i) {
    const auto j = i + below(free_steps.size() - i);
    std::swap(free_steps[i], free_steps[j]);
    plan.events[i].step = free_steps[i];
    plan.events[i].kill.step = free_steps[i];
  }
  std::sort(plan.events.begin(), plan.events.end(),
            [](const chaos_event& a, const chaos_event& b) { return a.step < b.step; });
  return plan;
}

namespace {

std::string event_name(const chaos_event& e) {
  if (e.kind == "kill") return "kill " + e.kill.role + "/" + std::to_string(e.kill.id);
  if (e.kind == "commit-outage") return "control-plane outage (3 s)";
  return "corrupted payload (receiver 0's first)";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string describe(const chaos_plan& plan) {
  std::string out = fmt::format("chaos schedule (seed {}, {} kill(s) per role, {} events):\n",
                                plan.seed, plan.kills_per_role, plan.events.size());
  for (const auto& e : plan.events) out += fmt::format("  step {:>3}  {}\n", e.step, event_name(e));
  return out;
}

json chaos_figures(const chaos_plan& plan, const json& steps, const std::set<fired_kill>& fired,
                   bool outage_injected) {
  std::map<std::int64_t, const json*> by_step;
  for (const auto& st : steps) by_step[st["step"].get<std::int64_t>()] = &st;
  auto step_ok = [&](std::int64_t k) {
    const auto it = by_step.find(k);
    return it != by_step.end() && it->second->value("committed_once", false) &&
           it->second->value("bit_exact", false);
  };
  auto attempts_of = [&](std::int64_t k) -> std::int64_t {
    const auto it = by_step.find(k);
    return it == by_step.end() ? 0 : it->second->at("attempts").get<std::int64_t>();
  };
  auto refetched_of = [&](std::int64_t k) -> std::uint64_t {
    const auto it = by_step.find(k);
    return it == by_step.end() ? 0 : it->second->value("refetched", std::uint64_t{0});
  };
  // The commit-to-commit period of step k: from step k-1's commit to step k's. It holds
  // everything a disruption costs (a restarted coordinator's recovery included, which the
  // transition's own clock, restarted with it, would miss).
  auto end_of = [&](std::int64_t k) -> std::optional<double> {
    const auto it = by_step.find(k);
    if (it == by_step.end() || !it->second->contains("end_unix") || !it->second->at("end_unix").is_number())
      return std::nullopt;
    return it->second->at("end_unix").get<double>();
  };
  std::map<std::int64_t, double> period;
  for (const auto& [k, st] : by_step)
    if (const auto a = end_of(k - 1), b = end_of(k); a && b) period[k] = *b - *a;
  // The transition's own time (seconds.total: its first attempt record to its commit): what
  // the attempts cost, without the candidates' wait or the verification between steps, so less
  // noisy; but a killed coordinator's successor starts this clock itself and misses its own
  // start-up.
  auto transition_of = [&](std::int64_t k) -> std::optional<double> {
    const auto it = by_step.find(k);
    if (it == by_step.end() || !it->second->contains("seconds")) return std::nullopt;
    const auto& t = it->second->at("seconds");
    if (!t.contains("refit") || !t.at("refit").is_number()) return std::nullopt;
    return t.at("refit").get<double>();
  };
  std::vector<double> clean, clean_transitions;
  json clean_steps = json::array();
  for (const auto& [k, p] : period)
    if (k >= 2 && plan.at(k) == nullptr && attempts_of(k) == 1) {
      clean.push_back(p);
      clean_steps.push_back(k);
      if (const auto t = transition_of(k)) clean_transitions.push_back(*t);
    }
  const bool have_median = !clean.empty();
  const double clean_median = have_median ? median(clean) : 0.0;
  const bool have_transition_median = !clean_transitions.empty();
  const double clean_transition_median = have_transition_median ? median(clean_transitions) : 0.0;

  struct role_count {
    int planned = 0, fired = 0, survived = 0;
    std::vector<double> lost, transition_lost;
  };
  std::map<std::string, role_count> roles;
  json schedule = json::array();
  bool ok = true;
  for (const auto& e : plan.events) {
    json j{{"step", e.step}, {"event", e.kind}};
    bool happened = false;
    if (e.kind == "kill") {
      j["role"] = e.kill.role;
      j["id"] = e.kill.id;
      happened = fired.count({e.kill.role, e.kill.id, e.step}) > 0;
    } else if (e.kind == "commit-outage") {
      happened = outage_injected;
    } else {  // corrupt: receiver 0 refused the damaged copy and fetched it again, or failed
      happened = attempts_of(e.step) > 1 || refetched_of(e.step) > 0;  // the attempt
    }
    const bool survived = happened && step_ok(e.step);
    ok = ok && survived;
    j["happened"] = happened;
    j["survived"] = survived;
    j["attempts"] = attempts_of(e.step);
    j["refetched"] = refetched_of(e.step);
    if (const auto it = by_step.find(e.step); it != by_step.end()) j["failures"] = it->second->at("failures");
    const auto p = period.find(e.step);
    j["period_seconds"] = p == period.end() ? json(nullptr) : json(p->second);
    const bool have_lost = p != period.end() && have_median;
    j["seconds_lost"] = have_lost ? json(p->second - clean_median) : json(nullptr);
    const auto t = transition_of(e.step);
    const bool have_transition_lost = t.has_value() && have_transition_median;
    j["transition_seconds"] = t ? json(*t) : json(nullptr);
    j["transition_seconds_lost"] = have_transition_lost ? json(*t - clean_transition_median) : json(nullptr);
    if (e.kind == "kill") {
      auto& r = roles[e.kill.role];
      ++r.planned;
      r.fired += happened ? 1 : 0;
      r.survived += survived ? 1 : 0;
      if (have_lost) r.lost.push_back(p->second - clean_median);
      if (have_transition_lost) r.transition_lost.push_back(*t - clean_transition_median);
    }
    schedule.push_back(j);
  }
  json role_json = json::object();
  int planned = 0, fired_n = 0, survived_n = 0;
  auto mean = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m += x / static_cast<double>(v.size());
    return v.empty() ? json(nullptr) : json(m);
  };
  for (const auto& [name, r] : roles) {
    role_json[name] = {{"planned", r.planned}, {"fired", r.fired}, {"survived", r.survived},
                       {"mean_seconds_lost", mean(r.lost)},
                       {"mean_transition_seconds_lost", mean(r.transition_lost)}};
    planned += r.planned;
    fired_n += r.fired;
    survived_n += r.survived;
  }
  json attempts = json::array();
  for (const auto& [k, st] : by_step) attempts.push_back(st->at("attempts"));
  return {{"seed", plan.seed},
          {"kills_per_role", plan.kills_per_role},
          {"schedule", schedule},
          {"roles", role_json},
          {"kills_planned", planned},
          {"kills_fired", fired_n},
          {"kills_survived", survived_n},
          {"attempts_per_step", attempts},
          {"clean_steps", clean_steps},
          {"clean_period_median_seconds", have_median ? json(clean_median) : json(nullptr)},
          {"clean_period_min_seconds", have_median ? json(*std::min_element(clean.begin(), clean.end())) : json(nullptr)},
          {"clean_period_max_seconds", have_median ? json(*std::max_element(clean.begin(), clean.end())) : json(nullptr)},
          {"clean_transition_median_seconds",
           have_transition_median ? json(clean_transition_median) : json(nullptr)},
          {"ok", ok}};
}

std::string describe_figures(const json& f) {
  std::string out = fmt::format(
      "  chaos (seed {}): {} of {} kills fired, {} survived; clean steps' commit-to-commit period "
      "median {}; lost = period - that median\n",
      f["seed"].get<std::uint64_t>(), f["kills_fired"].get<int>(), f["kills_planned"].get<int>(),
      f["kills_survived"].get<int>(),
      f["clean_period_median_seconds"].is_number()
          ? fmt::format("{:.3f} s ({} clean steps)", f["clean_period_median_seconds"].get<double>(),
                        f["clean_steps"].size())
          : std::string("n/a (no clean step)"));
  for (const auto& [role, r] : f["roles"].items())
    out += fmt::format("    {:<12} {} planned, {} fired, {} survived, {} lost per kill on average ({} in the transition)\n",
                       role, r["planned"].get<int>(), r["fired"].get<int>(), r["survived"].get<int>(),
                       r["mean_seconds_lost"].is_number()
                           ? fmt::format("{:.3f} s", r["mean_seconds_lost"].get<double>())
                           : std::string("n/a"),
                       r["mean_transition_seconds_lost"].is_number()
                           ? fmt::format("{:.3f} s", r["mean_transition_seconds_lost"].get<double>())
                           : std::string("n/a"));
  for (const auto& e : f["schedule"]) {
    std::string what = e["event"].get<std::string>();
    if (what == "kill") what += " " + e["role"].get<std::string>() + "/" + std::to_string(e["id"].get<int>());
    out += fmt::format("    step {:>3}  {:<24} {:<9} {} attempt(s)  {}\n", e["step"].get<std::int64_t>(), what,
                       !e["happened"].get<bool>() ? "NOT-FIRED" : e["survived"].get<bool>() ? "survived" : "FAILED",
                       e["attempts"].get<std::int64_t>(),
                       e["seconds_lost"].is_number() ? fmt::format("{:+.3f} s", e["seconds_lost"].get<double>())
                                                     : std::string("n/a"));
  }
  out += fmt::format("  chaos result: {}\n", f["ok"].get<bool>() ? "every disruption happened and was survived"
                                                                  : "NOT every disruption happened and was survived");
  return out;
}

}  // namespace dcr_tool
