// tools/dcr/simulate.cpp: `dcr simulate` (see simulate.hpp and docs/overview.md).
#include "simulate.hpp"

#include <fmt/core.h>

#include <chrono>
#include <optional>
#include <stdexcept>

#include "args.hpp"
#include "dcr/sim/deployment.hpp"

namespace dcr_tool {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

constexpr const char* usage = R"(usage: dcr simulate [options]

End-to-end refit of a synthetic MoE model (trainer TP x DP with row/column splits and stacked
experts -> receivers with their own TP, fused QKV and gate/up), verified bit for bit against a
dense refit through the same engine loader after every step.

options:
  --size BYTES          model size, suffix K/M/G allowed (default 1G)
  --steps N             optimizer steps to refit (default 3)
  --change-rate R       share of elements each step touches (default 0.01)
  --seed S              random seed (default 1)
  --dtype T             bf16 | f16 | f32 (default bf16)
  --trainer-tp N        trainer tensor-parallel degree (default 2)
  --trainer-dp N        trainer data-parallel replicas (default 2)
  --receiver-tp N       serving ranks, each with its own tensor-parallel slice (default 4)
  --encoding E          mixed | xor | overwrite (default mixed)
  --level N             zstd level (default 1)
  --bucket-mb N         raw record MB per payload (default 64)
  --fault F             none | duplicate | corrupt | drop-receiver (default none)
  --fault-step N        step whose first attempt gets the fault (default 2)
  --json                print the report as JSON instead of tables
  -h, --help            this text
)";

struct step_result {
  std::uint64_t step = 0;
  bool bit_exact = false;
  bool committed = false;
  std::string mismatch;
  dcr::transition_report report;
  double verify_seconds = 0;
  double wall_seconds = 0;
};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    o += c;
  }
  return o;
}

const char* policy_name(dcr::encoding_policy p) {
  switch (p) {
    case dcr::encoding_policy::mixed: return "mixed";
    case dcr::encoding_policy::overwrite_only: return "overwrite";
    case dcr::encoding_policy::xor_only: return "xor";
    case dcr::encoding_policy::ulp_only: return "ulp";
  }
  return "?";
}

}  // namespace

int simulate_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", usage);
    return 0;
  }
  const std::uint64_t size = parse_size(args.value("--size", "1G"));
  const auto steps = args.integer("--steps", 3);
  const double rate = args.real("--change-rate", 0.01);
  const auto seed = static_cast<std::uint64_t>(args.integer("--seed", 1));
  const auto dtype_text = args.value("--dtype", "bf16");
  const int trainer_tp = static_cast<int>(args.integer("--trainer-tp", 2));
  const int trainer_dp = static_cast<int>(args.integer("--trainer-dp", 2));
  const int receiver_tp = static_cast<int>(args.integer("--receiver-tp", 4));
  const auto encoding_text = args.value("--encoding", "mixed");
  const int level = static_cast<int>(args.integer("--level", 1));
  const auto bucket_mb = args.integer("--bucket-mb", 64);
  const auto fault_text = args.value("--fault", "none");
  const auto fault_step = args.integer("--fault-step", 2);
  const bool json = args.flag("--json");
  args.finish();

  std::optional<dcr::dtype> type;
  if (dtype_text == "bf16") type = dcr::dtype::bf16;
  if (dtype_text == "f16") type = dcr::dtype::f16;
  if (dtype_text == "f32") type = dcr::dtype::f32;
  if (!type) throw usage_error("--dtype must be bf16, f16 or f32");
  if (steps < 0) throw usage_error("--steps must be >= 0");
  if (!(rate >= 0 && rate <= 1)) throw usage_error("--change-rate must be in [0, 1]");
  if (trainer_tp < 1 || trainer_dp < 1 || receiver_tp < 1)
    throw usage_error("--trainer-tp, --trainer-dp and --receiver-tp must be >= 1");
  if (bucket_mb < 1) throw usage_error("--bucket-mb must be >= 1");
  dcr::refit_options options;
  if (encoding_text == "mixed") options.policy = dcr::encoding_policy::mixed;
  else if (encoding_text == "xor") options.policy = dcr::encoding_policy::xor_only;
  else if (encoding_text == "overwrite") options.policy = dcr::encoding_policy::overwrite_only;
  else throw usage_error("--encoding must be mixed, xor or overwrite");
  options.codec.zstd_level = level;
  options.bucket_bytes = static_cast<std::size_t>(bucket_mb) << 20;
  if (fault_text != "none" && fault_text != "duplicate" && fault_text != "corrupt" &&
      fault_text != "drop-receiver")
    throw usage_error("--fault must be none, duplicate, corrupt or drop-receiver");

  // ---- Model, trainer, owners, receivers (dense-loaded with version 0), commit record.
  const auto setup_start = clock_type::now();
  dcr::sim::deployment_options setup;
  setup.model = dcr::sim::moe_config::for_bytes(size, *type);
  setup.trainer_tp = trainer_tp;
  setup.trainer_dp = trainer_dp;
  setup.receiver_tp = receiver_tp;
  setup.seed = seed;
  dcr::sim::in_process_deployment deployment(setup);
  deployment.start();
  const auto& config = setup.model;
  const auto& registry = deployment.registry();
  const double setup_seconds = seconds_since(setup_start);

  const auto checkpoint_bytes = static_cast<std::uint64_t>(registry.total_bytes());
  if (!json) {
    fmt::print("dcr simulate: {} canonical tensors, {:.1f} MB {} checkpoint ({} layers, hidden {}, "
               "{} experts)\n",
               registry.size(), checkpoint_bytes / 1e6, dcr::dtype_name(config.type),
               config.layers, config.hidden, config.experts);
    fmt::print("  trainer TP={} DP={} ({} owners), receivers TP={} (fused qkv, gate_up, expert "
               "parallel), change rate {}, setup {:.2f} s\n",
               trainer_tp, trainer_dp, deployment.owner_count(), receiver_tp, rate, setup_seconds);
  }

  // ---- Steps.
  std::vector<step_result> results;
  bool all_ok = true;
  for (std::int64_t step = 1; step <= steps; ++step) {
    const auto step_start = clock_type::now();
    step_result res;
    res.step = static_cast<std::uint64_t>(step);
    deployment.trainer().stress_step(rate);
    dcr::fault_plan faults;
    if (step == fault_step && fault_text != "none") {
      faults = [&](std::uint32_t attempt, std::size_t receiver, std::size_t ordinal) {
        if (attempt != 0 || receiver != 0 || ordinal != 0) return dcr::delivery_action::deliver;
        if (fault_text == "duplicate") return dcr::delivery_action::deliver_twice;
        if (fault_text == "corrupt") return dcr::delivery_action::corrupt;
        return dcr::delivery_action::fail_receiver;
      };
    }
    res.report = deployment.refit(options, faults);
    res.committed = res.report.committed;

    // Verify: dense refit of the same candidate weights through the same loader.
    const auto verify_start = clock_type::now();
    res.mismatch = res.committed ? deployment.verify_against_dense_refit() : "not committed";
    res.bit_exact = res.mismatch.empty();
    res.verify_seconds = seconds_since(verify_start);
    res.wall_seconds = seconds_since(step_start);
    all_ok = all_ok && res.bit_exact;

    if (!json) {
      const auto& last = res.report.attempts.back();
      std::uint64_t bytes = 0;
      for (const auto& a : res.report.attempts) bytes += a.payload_bytes;
      fmt::print("step {:>3}: {:>11} changed  {:>12} payload bytes  {:.3f} B/changed  "
                 "{} attempt(s)  {}{}\n",
                 step, last.changed_elements, bytes,
                 last.changed_elements ? static_cast<double>(bytes) / last.changed_elements : 0.0,
                 res.report.attempts.size(),
                 res.bit_exact ? "bit-exact" : "MISMATCH",
                 res.mismatch.empty() ? "" : " (" + res.mismatch + ")");
      for (const auto& a : res.report.attempts)
        if (!a.failure.empty())
          fmt::print("          attempt {} failed: {}\n", a.attempt, a.failure);
    }
    results.push_back(std::move(res));
  }

  // ---- Report.
  if (json) {
    std::string out = "{\n";
    out += fmt::format("  \"checkpoint_bytes\": {},\n  \"canonical_tensors\": {},\n", checkpoint_bytes,
                       registry.size());
    out += fmt::format("  \"config\": {{\"dtype\": \"{}\", \"layers\": {}, \"hidden\": {}, \"experts\": {}, "
                       "\"trainer_tp\": {}, \"trainer_dp\": {}, \"receiver_tp\": {}, \"change_rate\": {}, "
                       "\"seed\": {}, \"encoding\": \"{}\", \"zstd_level\": {}}},\n",
                       dcr::dtype_name(config.type), config.layers, config.hidden, config.experts,
                       trainer_tp, trainer_dp, receiver_tp, rate, seed,
                       policy_name(options.policy), level);
    out += fmt::format("  \"setup_seconds\": {:.6f},\n  \"steps\": [", setup_seconds);
    for (std::size_t k = 0; k < results.size(); ++k) {
      const auto& r = results[k];
      std::uint64_t bytes = 0, payloads = 0;
      for (const auto& a : r.report.attempts) {
        bytes += a.payload_bytes;
        payloads += a.payloads;
      }
      const auto& last = r.report.attempts.back();
      out += fmt::format(
          "{}\n    {{\"step\": {}, \"bit_exact\": {}, \"committed\": {}, \"attempts\": {}, "
          "\"payloads\": {}, \"payload_bytes\": {}, \"changed_elements\": {}, \"records\": {}, "
          "\"bytes_per_changed\": {:.6f}, \"ratio_to_checkpoint\": {:.8f}, "
          "\"seconds\": {{\"detect\": {:.6f}, \"project\": {:.6f}, \"encode\": {:.6f}, "
          "\"compress\": {:.6f}, \"apply\": {:.6f}, \"commit\": {:.6f}, \"verify\": {:.6f}, "
          "\"step\": {:.6f}}}, \"failures\": [",
          k ? "," : "", r.step, r.bit_exact, r.committed, r.report.attempts.size(), payloads,
          bytes, last.changed_elements, last.records,
          last.changed_elements ? static_cast<double>(bytes) / last.changed_elements : 0.0,
          static_cast<double>(bytes) / checkpoint_bytes, last.detect_seconds, last.project_seconds,
          last.encode_seconds, last.compress_seconds, last.apply_seconds, last.commit_seconds,
          r.verify_seconds, r.wall_seconds);
      bool first = true;
      for (const auto& a : r.report.attempts)
        if (!a.failure.empty()) {
          out += fmt::format("{}\"{}\"", first ? "" : ", ", json_escape(a.failure));
          first = false;
        }
      out += "]";
      if (!r.mismatch.empty()) out += fmt::format(", \"mismatch\": \"{}\"", json_escape(r.mismatch));
      out += "}";
    }
    out += fmt::format("\n  ],\n  \"all_bit_exact\": {}\n}}\n", all_ok);
    fmt::print("{}", out);
  } else if (!results.empty()) {
    std::uint64_t changed = 0, bytes = 0, records = 0;
    double detect = 0, project = 0, encode = 0, compress = 0, apply = 0, commit = 0, verify = 0;
    for (const auto& r : results) {
      for (const auto& a : r.report.attempts) {
        bytes += a.payload_bytes;
        detect += a.detect_seconds;
        project += a.project_seconds;
        encode += a.encode_seconds;
        compress += a.compress_seconds;
        apply += a.apply_seconds;
        commit += a.commit_seconds;
      }
      changed += r.report.attempts.back().changed_elements;
      records += r.report.attempts.back().records;
      verify += r.verify_seconds;
    }
    const double n = static_cast<double>(results.size());
    fmt::print("\nsummary over {} step(s)\n", results.size());
    fmt::print("  {:<34} {:>16}\n", "checkpoint bytes", checkpoint_bytes);
    fmt::print("  {:<34} {:>16.0f}\n", "changed elements / step", changed / n);
    fmt::print("  {:<34} {:>16.0f}\n", "records / step", records / n);
    fmt::print("  {:<34} {:>16.0f}\n", "payload bytes / step", bytes / n);
    fmt::print("  {:<34} {:>16.3f}\n", "bytes per changed element",
               changed ? static_cast<double>(bytes) / changed : 0.0);
    fmt::print("  {:<34} {:>15.3f}%\n", "payload / checkpoint", 100.0 * bytes / n / checkpoint_bytes);
    fmt::print("  {:<34} {:>15.1f}x\n", "fewer bytes than full checkpoint",
               bytes ? checkpoint_bytes * n / bytes : 0.0);
    fmt::print("  stage seconds / step: detect {:.3f}  project {:.3f}  encode {:.3f}  compress {:.3f}"
               "  apply {:.3f}  commit {:.3f}  (verify {:.3f})\n",
               detect / n, project / n, encode / n, compress / n, apply / n, commit / n, verify / n);
    fmt::print("  result: {}\n", all_ok ? "every step bit-exact" : "NOT bit-exact");
  }
  return all_ok ? 0 : 1;
}

}  // namespace dcr_tool
