// tools/dcr/simulate.cpp: `dcr simulate` (see simulate.hpp and docs/simulate.md).
#include "simulate.hpp"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "args.hpp"
#include "device_choice.hpp"
#include "dcr/error_text.hpp"
#include "dcr/protocol/link_shaper.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "dcr/sim/deployment.hpp"
#include "simulate_backends.hpp"
#include "simulate_processes.hpp"

namespace dcr_tool {
namespace {

using clock_type = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;  // keys in the order written
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

constexpr const char* usage = R"(usage: dcr simulate [options]

End-to-end refit of a synthetic MoE model from a Megatron-style trainer (TP x DP: fused QKV
converted by a residual task, fused gate/up, row/column splits, stacked experts) to serving
ranks with their own TP and a vLLM-style layout (fused qkv and gate_up, padded vocab-parallel
embeddings, fp32/bf16 norm copies, transposed router, expert parallel), verified bit for bit
against a dense refit through the same engine loader after every step.

By default the coordinator, every owner and every receiver run as separate processes that talk
only through a filesystem payload store and a filesystem control plane in a fresh temporary
directory (removed at the end unless --keep); each computes only its own part of the model from
the seed and step, and each receiver checks its own storage against a dense refit it computes.

processes:
  --in-process          one process plays every role (in-memory store and control plane)
  --commit C            file[:DIR] | etcd[s]://HOST:PORT[/PREFIX][?OPTIONS] | memory
                        (= --in-process) (default file, in the work directory); etcd OPTIONS:
                        ca=FILE, cert=FILE, key=FILE (etcds), user=NAME, password-file=FILE
                        (else DCR_ETCD_PASSWORD), joined by '&' (docs/guide-stores.md)
  --store DIR           filesystem payload store directory (default: in the work directory)
  --transport T         file | s3://BUCKET[/PREFIX] | relay: how payloads travel from owners
                        to receivers (default file, the filesystem payload store; relay: owners
                        stream to relay roots that forward to every receiver's node over
                        mutual TLS, see docs/transports.md). S3 credentials
                        come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and
                        AWS_SESSION_TOKEN), else the AWS_PROFILE profile of
                        AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials); the run's objects go
                        under PREFIX/<run>/ and are erased at the end unless --keep
  --s3-endpoint URL     the S3 service, e.g. http://127.0.0.1:8333 (default AWS,
                        https://s3.REGION.amazonaws.com)
  --s3-region R         signing region (default AWS_REGION, AWS_DEFAULT_REGION or us-east-1)
  --s3-ca-bundle FILE   PEM CAs an https endpoint is verified against (sets AWS_CA_BUNDLE for
                        the run; default AWS_CA_BUNDLE, else the system's)
  --s3-addressing A     path | virtual: BUCKET in the path or in the host name (default path
                        with --s3-endpoint, virtual for AWS)
  --s3-fanout           rollout nodes each download a disjoint share of every attempt from S3
                        and forward it to the others over local links, so each payload
                        crosses the cluster boundary once instead of once per rollout node
  --s3-parallel-gets N  S3 gets in flight per receiver (default 4)
  --s3-multipart-mb N   payloads larger than N MiB go up as multipart uploads (default 64)
  --relay-roots N       relay roots, each its own process with its own cross-cluster flow(s);
                        payloads are striped over them (default 4; 1 is the paper's relay tree)
  --relay-flows N       cross-cluster flows per root: owner o uses flow o mod N (default 1)
  --relay-port-base N   roots listen on 127.0.0.1:N.., then receiver r's node on N+roots+r
                        (default: a free range)
  --relay-certs DIR     the CA and certificates (DIR/ca.pem, DIR/{owner,root,node}.{pem,key}, as
                        scripts/make-test-certs.sh DIR writes them; default: a throwaway CA made
                        in the work directory)
  --trainer-nodes N     owners are grouped into N trainer nodes (trainer rank mod N), each with
                        one cross-cluster flow (default 1)
  --rollout-nodes N     receiver ranks are grouped into N rollout nodes (rank mod N), each
                        with one cross-cluster flow (default 1)
  --link-rate RATE      shape every cross-cluster flow to RATE (e.g. 20MB/s, 1Gbps; default
                        0, unlimited); local links are not shaped
  --reference           after the refits, time the paper's reference on the same flows: each
                        trainer node uploads its share of the full checkpoint to object
                        storage, then each rollout node downloads all of it
  --keep                keep the work directory (control plane, payloads, per-process results)
  --kill ROLE[/ID]:STEP SIGKILL receiver/owner/coordinator/relay-root ID (default 0) in the
                        middle of step STEP (a receiver during apply, an owner while putting
                        payloads, the coordinator with every acknowledgement in and before the
                        commit, a relay root once it forwarded a first chunk); it is started
                        again and recovers; repeatable (a restarted process can be killed
                        again at a later step)
  --chaos SEED          a chaos run: draw from SEED kills of every role (receiver, owner,
                        coordinator, relay-root with --transport relay) at random steps, one
                        commit outage and one corrupted payload, one event per step from step
                        2 on; prints the schedule and reports kills fired and survived, the
                        attempts per step and the seconds each disruption cost (not with
                        --kill, --commit-outage or --fault)
  --chaos-kills N       kills per role in a chaos run (default steps / 8, at least 1)
  --commit-outage STEP  the control plane is unreachable for 3 s during step STEP (the file
                        store's directory moved aside; an etcd server whose pid is in
                        DCR_ETCD_PID frozen with SIGSTOP)
  --async               receivers stage payloads while serving and apply after the last one
  --no-pipeline         owners build every chunk before packing and putting any
  --owner-threads N     threads each owner builds and compresses its payloads on (1 to 64,
                        default 1): every chunk built, then every payload compressed, on N
                        threads, then put (the pipelined build's payloads, byte for byte; not
                        with --in-process or --device cuda)
  --verify V            every | last: receivers check every step against a dense refit, or only
                        the last one (benchmarks: no verification overlapping later steps)
  --timeout SECONDS     deadline of every protocol wait (default 300)

options:
  --size BYTES          model size, suffix K/M/G allowed (default 1G)
  --steps N             optimizer steps to refit (default 3)
  --change-rate R       share of elements each step touches (default 0.01)
  --seed S              random seed (default 1)
  --dtype T             bf16 | f16 | f32 (default bf16)
  --trainer-tp N        trainer tensor-parallel degree (default 2)
  --trainer-dp N        trainer data-parallel replicas (default 2)
  --receiver-tp N       serving ranks, each with its own tensor-parallel slice (default 4)
  --layout L            serving | plain: both sides' layouts at once (default serving:
                        Megatron trainer, serving engine)
  --trainer-layout L    megatron | plain (overrides --layout for the trainer)
  --engine-layout L     serving | plain (overrides --layout for the receivers)
  --tie T               none | omit-lm-head | store-both: tied embeddings (default none)
  --apply-path P        compiled | general (default compiled)
  --device D            cpu | cuda: where owners detect (detect + compact, projection, tracker
                        update) and receivers apply (default cpu). cuda needs a CUDA device and
                        a build with nvcc; without either it stops before starting anything,
                        with exit status 3 and the reason (never a silent CPU run)
  --encoding E          mixed | xor | ulp | overwrite (default mixed)
  --level N             zstd level (default 1)
  --bucket-mb N         raw record MB per payload (default 64)
  --fault F             none | duplicate | corrupt | drop-receiver | reorder | delay | stale
                        (default none; stale, reorder and delay need separate processes)
  --fault-step N        step whose first attempt gets the fault (default 2)
  --json                print the report as JSON instead of tables
  -h, --help            this text

exit status: 0 every step committed once and bit-exact; 1 not, or an error; 2 a usage error;
3 the --device asked for is not available here.
)";

/// Exit status of `--device cuda` where no CUDA device (or no CUDA backend) is available.
constexpr int device_unavailable_status = 3;

struct step_result {
  std::uint64_t step = 0;
  bool bit_exact = false;
  bool committed = false;
  std::string mismatch;
  dcr::transition_report report;
  double verify_seconds = 0;
  double wall_seconds = 0;        ///< the whole step: candidates, refit, verify
  double candidates_seconds = 0;  ///< the synthetic trainer making the step's weights
};

const char* policy_name(dcr::encoding_policy p) {
  switch (p) {
    case dcr::encoding_policy::mixed: return "mixed";
    case dcr::encoding_policy::overwrite_only: return "overwrite";
    case dcr::encoding_policy::xor_only: return "xor";
    case dcr::encoding_policy::ulp_only: return "ulp";
  }
  return "?";
}

/// Changed canonical elements of an attempt: changed words of affine shards plus changed
/// elements of rebuilt residual outputs (a fused QKV change shows up as a canonical change).
std::uint64_t changed_elements(const dcr::attempt_report& a) {
  return a.owners.changed_elements + a.owners.residual_changed_elements;
}

/// Owner time spent on residual tasks: change flags, conversions, compares with the baseline.
double residual_seconds(const dcr::attempt_report& a) {
  return a.owners.residual_detect_seconds + a.owners.convert_seconds + a.owners.residual_compare_seconds;
}



// ---- Flags: each group parsed into simulate_settings, each throws usage_error naming the flag.

/// The model, the layouts and the codec: --size, --steps, --change-rate, --seed, --dtype, the
/// TP/DP flags, --layout and its refinements, --tie, --apply-path, --encoding, --level,
/// --bucket-mb, --device, --fault and --fault-step (the fault itself is checked here; where it
/// may run, in check_modes).
void parse_model_flags(arg_parser& args, simulate_settings& s) {
  s.size = parse_size(args.value("--size", "1G"));
  s.steps = args.integer("--steps", 3);
  s.rate = args.real("--change-rate", 0.01);
  s.seed = static_cast<std::uint64_t>(args.integer("--seed", 1));
  const auto dtype_text = args.value("--dtype", "bf16");
  s.trainer_tp = static_cast<int>(args.integer("--trainer-tp", 2));
  s.trainer_dp = static_cast<int>(args.integer("--trainer-dp", 2));
  s.receiver_tp = static_cast<int>(args.integer("--receiver-tp", 4));
  const auto layout_text = args.value("--layout", "serving");
  const auto trainer_layout_text =
      args.value("--trainer-layout", layout_text == "plain" ? "plain" : "megatron");
  const auto engine_layout_text = args.value("--engine-layout", layout_text);
  const auto tie_text = args.value("--tie", "none");
  s.apply_path_text = args.value("--apply-path", "compiled");
  const auto encoding_text = args.value("--encoding", "mixed");
  const int level = static_cast<int>(args.integer("--level", 1));
  const auto bucket_mb = args.integer("--bucket-mb", 64);
  s.fault = args.value("--fault", "none");
  s.fault_step = args.integer("--fault-step", 2);

  std::optional<dcr::dtype> type;
  if (dtype_text == "bf16") type = dcr::dtype::bf16;
  if (dtype_text == "f16") type = dcr::dtype::f16;
  if (dtype_text == "f32") type = dcr::dtype::f32;
  if (!type) throw usage_error("--dtype must be bf16, f16 or f32");
  if (s.steps < 0) throw usage_error("--steps must be >= 0");
  if (!(s.rate >= 0 && s.rate <= 1)) throw usage_error("--change-rate must be in [0, 1]");
  if (s.trainer_tp < 1 || s.trainer_dp < 1 || s.receiver_tp < 1)
    throw usage_error("--trainer-tp, --trainer-dp and --receiver-tp must be >= 1");
  if (bucket_mb < 1) throw usage_error("--bucket-mb must be >= 1");
  if (layout_text != "serving" && layout_text != "plain")
    throw usage_error("--layout must be serving or plain");
  s.trainer_layout = dcr::sim::trainer_layout::megatron;
  if (trainer_layout_text == "plain") s.trainer_layout = dcr::sim::trainer_layout::plain;
  else if (trainer_layout_text != "megatron")
    throw usage_error("--trainer-layout must be megatron or plain");
  s.engine_layout = dcr::sim::engine_layout::serving;
  if (engine_layout_text == "plain") s.engine_layout = dcr::sim::engine_layout::plain;
  else if (engine_layout_text != "serving")
    throw usage_error("--engine-layout must be serving or plain");
  dcr::sim::embedding_tie tie = dcr::sim::embedding_tie::none;
  if (tie_text == "omit-lm-head") tie = dcr::sim::embedding_tie::omit_lm_head;
  else if (tie_text == "store-both") tie = dcr::sim::embedding_tie::store_both;
  else if (tie_text != "none") throw usage_error("--tie must be none, omit-lm-head or store-both");
  s.path = dcr::apply_path::compiled;
  if (s.apply_path_text == "general") s.path = dcr::apply_path::general;
  else if (s.apply_path_text != "compiled")
    throw usage_error("--apply-path must be compiled or general");
  if (encoding_text == "mixed") s.options.policy = dcr::encoding_policy::mixed;
  else if (encoding_text == "xor") s.options.policy = dcr::encoding_policy::xor_only;
  else if (encoding_text == "ulp") s.options.policy = dcr::encoding_policy::ulp_only;
  else if (encoding_text == "overwrite") s.options.policy = dcr::encoding_policy::overwrite_only;
  else throw usage_error("--encoding must be mixed, xor, ulp or overwrite");
  s.options.codec.zstd_level = level;
  s.options.bucket_bytes = static_cast<std::size_t>(bucket_mb) << 20;
  s.model = dcr::sim::moe_config::for_bytes(s.size, *type);
  s.model.tie_embeddings = tie;
  try {
    s.device = parse_device(args.value("--device", "cpu"));
  } catch (const dcr::error& e) {
    throw usage_error(dcr::error_text(e));
  }
  if (s.device == dcr::exec::device_kind::cuda && s.path == dcr::apply_path::general)
    throw usage_error("--device cuda applies on the compiled path (not --apply-path general, whose "
                      "loader writes host storage)");
  if (s.fault != "none" && s.fault != "duplicate" && s.fault != "corrupt" &&
      s.fault != "drop-receiver" && s.fault != "reorder" && s.fault != "delay" &&
      s.fault != "stale")
    throw usage_error("--fault must be none, duplicate, corrupt, drop-receiver, reorder, delay or stale");
}

/// Where the processes meet and how payloads travel: --commit, --store, --transport and its
/// S3 and relay flags, --link-rate, the node counts, --reference.
void parse_transport_flags(arg_parser& args, simulate_settings& s) {
  s.commit = args.value("--commit", "file");
  s.store = args.value("--store", "");
  s.transport = args.value("--transport", "file");
  s.reference = args.flag("--reference");
  s.trainer_nodes = static_cast<int>(args.integer("--trainer-nodes", 1));
  s.rollout_nodes = static_cast<int>(args.integer("--rollout-nodes", 1));
  try {
    s.link_rate = dcr::parse_link_rate(args.value("--link-rate", "0"));
  } catch (const dcr::error& e) {
    throw usage_error(std::string("--link-rate: ") + dcr::error_text(e));
  }
  if (s.trainer_nodes < 1 || s.rollout_nodes < 1)
    throw usage_error("--trainer-nodes and --rollout-nodes must be at least 1");
  s.s3_endpoint = args.value("--s3-endpoint", "");
  s.s3_region = args.value("--s3-region", "");
  s.s3_addressing = args.value("--s3-addressing", "");
  const auto ca_bundle = args.value("--s3-ca-bundle", "");
  s.s3_fanout = args.flag("--s3-fanout");
  const auto parallel_gets = args.integer("--s3-parallel-gets", -1);  // -1: not given
  const auto multipart_mb = args.integer("--s3-multipart-mb", -1);
  if (parallel_gets != -1) s.s3_parallel_gets = static_cast<int>(parallel_gets);
  if (multipart_mb != -1) s.s3_multipart_mb = multipart_mb;
  if (s.transport.rfind("s3://", 0) == 0) {
    try {
      dcr::parse_s3_url(s.transport);
    } catch (const dcr::error& e) {
      throw usage_error("--transport: " + dcr::error_text(e));
    }
    if (!s.s3_addressing.empty() && s.s3_addressing != "path" && s.s3_addressing != "virtual")
      throw usage_error("--s3-addressing must be path or virtual");
    if (s.s3_parallel_gets < 1 || s.s3_parallel_gets > 64)
      throw usage_error("--s3-parallel-gets must be 1 to 64");
    if (s.s3_multipart_mb < 5) throw usage_error("--s3-multipart-mb must be at least 5 (S3's smallest part)");
    if (!s.store.empty()) throw usage_error("--store is the file transport's directory (not with --transport s3://...)");
    // The environment carries it to every process of the run (s3_options::from_environment).
    if (!ca_bundle.empty()) ::setenv("AWS_CA_BUNDLE", ca_bundle.c_str(), 1);
  } else if (s.transport != "file" && s.transport != "relay") {
    throw usage_error("--transport must be file, relay or s3://BUCKET[/PREFIX]");
  } else if (!s.s3_endpoint.empty() || !s.s3_region.empty() || !s.s3_addressing.empty() ||
             !ca_bundle.empty() || s.s3_fanout || parallel_gets != -1 || multipart_mb != -1) {
    throw usage_error("the --s3-* options need --transport s3://BUCKET[/PREFIX]");
  }
  s.relay_roots = static_cast<int>(args.integer("--relay-roots", 4));
  s.relay_flows = static_cast<int>(args.integer("--relay-flows", 1));
  s.relay_port_base = static_cast<int>(args.integer("--relay-port-base", 0));
  s.relay_certs = args.value("--relay-certs", "");
  if (s.relay_roots < 1 || s.relay_flows < 1)
    throw usage_error("--relay-roots and --relay-flows must be at least 1");
  if (s.relay_port_base < 0 || s.relay_port_base > 65535)
    throw usage_error("--relay-port-base must be a port number");
}

/// How the processes run: --keep, --async, --no-pipeline, --owner-threads, --verify,
/// --commit-outage, --timeout.
void parse_run_flags(arg_parser& args, simulate_settings& s) {
  s.keep = args.flag("--keep");
  s.asynchronous = args.flag("--async");
  s.pipelined = !args.flag("--no-pipeline");
  const auto owner_threads = args.integer("--owner-threads", 1);
  if (owner_threads < 1 || owner_threads > 64)
    throw usage_error("--owner-threads must be 1 to 64 (threads per owner), got " +
                      std::to_string(owner_threads));
  s.owner_threads = static_cast<std::size_t>(owner_threads);
  const auto verify_text = args.value("--verify", "every");
  if (verify_text != "every" && verify_text != "last")
    throw usage_error("--verify must be every or last");
  s.verify_every = verify_text == "every";
  s.commit_outage = args.integer("--commit-outage", -1);
  s.timeout_seconds = args.real("--timeout", 300);
}

/// Planned disruptions: --kill (repeatable) and --chaos SEED with --chaos-kills.
void parse_disruption_flags(arg_parser& args, simulate_settings& s) {
  for (std::string k = args.value("--kill", ""); !k.empty(); k = args.value("--kill", "")) {
    const auto colon = k.find(':');
    if (colon == std::string::npos) throw usage_error("--kill needs ROLE[/ID]:STEP, got '" + k + "'");
    kill_request kr;
    kr.role = k.substr(0, colon);
    if (const auto slash = kr.role.find('/'); slash != std::string::npos) {
      kr.id = std::stoi(kr.role.substr(slash + 1));
      kr.role = kr.role.substr(0, slash);
    }
    if (kr.role != "receiver" && kr.role != "owner" && kr.role != "coordinator" &&
        !(kr.role == "relay-root" && s.transport == "relay"))
      throw usage_error("--kill: ROLE must be receiver, owner or coordinator (or relay-root with --transport relay)");
    kr.step = std::stoll(k.substr(colon + 1));
    s.kills.push_back(kr);
  }
  if (const auto chaos = args.value("--chaos", ""); !chaos.empty()) {
    std::size_t end = 0;
    try {
      if (chaos[0] != '-') s.chaos_seed = std::stoull(chaos, &end);
    } catch (const std::exception&) {
    }
    if (!s.chaos_seed || end != chaos.size())
      throw usage_error("--chaos needs a seed (an integer >= 0), got '" + chaos + "'");
  }
  s.chaos_kills = static_cast<int>(args.integer("--chaos-kills", -1));
  if (s.chaos_kills != -1 && !s.chaos_seed) throw usage_error("--chaos-kills needs --chaos SEED");
  if (s.chaos_seed && s.chaos_kills < -1) throw usage_error("--chaos-kills must be >= 0");
}

/// What the parent tells an agent process it starts: --role, --id, --workdir, --restarted.
void parse_agent_flags(arg_parser& args, simulate_settings& s) {
  s.role = args.value("--role", "");
  s.id = static_cast<int>(args.integer("--id", 0));
  s.workdir = args.value("--workdir", "");
  s.restarted = args.flag("--restarted");
}

/// The combinations of flags a run cannot honour (in one process, or beside --chaos).
void check_modes(const simulate_settings& s, bool in_process) {
  if (s.commit != "file" && s.commit != "memory" && s.commit.rfind("file:", 0) != 0 &&
      s.commit.rfind("etcd://", 0) != 0 && s.commit.rfind("etcds://", 0) != 0)
    throw usage_error("--commit must be file[:DIR], etcd[s]://HOST:PORT[/PREFIX][?OPTIONS] or memory");
  if (in_process && (s.transport != "file" || s.link_rate > 0 || s.trainer_nodes > 1 ||
                     s.rollout_nodes > 1 || s.reference))
    throw usage_error("--transport, --link-rate, --reference and the node options need separate processes (not --in-process)");
  if (in_process && (!s.kills.empty() || s.commit_outage >= 0 || s.asynchronous))
    throw usage_error("--kill, --commit-outage and --async need separate processes (not --in-process)");
  if (in_process && s.chaos_seed)
    throw usage_error("--chaos needs separate processes (not --in-process)");
  if (in_process && s.owner_threads > 1)
    throw usage_error("--owner-threads needs separate processes (not --in-process)");
  if (s.device == dcr::exec::device_kind::cuda && s.owner_threads > 1)
    throw usage_error("--owner-threads builds on the CPU: with --device cuda an owner detects "
                      "on the GPU from one thread (not both)");
  if (s.chaos_seed && (!s.kills.empty() || s.commit_outage >= 0 || s.fault != "none"))
    throw usage_error("--chaos draws its own kills, outage and corrupted payload (not with --kill, "
                      "--commit-outage or --fault)");
  if (in_process && (s.fault == "reorder" || s.fault == "delay" || s.fault == "stale"))
    throw usage_error("--fault " + s.fault + " needs separate processes (not --in-process)");
}

/// The parent, before any process starts: can the device run here? (Agent processes were
/// started by a parent that checked.) --device cuda never falls back to the CPU. Returns the
/// exit status when it cannot, after saying why (as JSON too with --json).
std::optional<int> refuse_unavailable_device(simulate_settings& s) {
  if (!s.role.empty()) return std::nullopt;
  try {
    s.device_description = select_device(s.device).description;
    return std::nullopt;
  } catch (const dcr::error& e) {
    if (e.dcr_code() != dcr::errc::device_error) throw;
    if (s.json)
      fmt::print("{}\n",
                 ojson{{"error", {{"code", "device_error"}, {"message", dcr::error_text(e)}}},
                       {"device", dcr::exec::device_name(s.device)},
                       {"exit_status", device_unavailable_status}}
                     .dump(-1, ' ', false, ojson::error_handler_t::replace));
    fmt::print(stderr, "dcr simulate: error [{}]: {}\n", e.code().message(), dcr::error_text(e));
    return device_unavailable_status;
  }
}

/// `dcr simulate --in-process`: one process plays every role over the in-memory plane and store
/// (dcr::sim::in_process_deployment); each step is refit, then checked against a dense refit.
/// Returns the exit status.
/// What the in-process report says about the deployment besides the steps.
struct in_process_facts {
  std::uint64_t checkpoint_bytes = 0;
  std::size_t canonical_tensors = 0;
  dcr::sim::moe_config config;
  dcr::task_coverage coverage;
  std::size_t overwrite_only_tensors = 0;
  std::size_t residual_tasks = 0;
  std::string detect_on, apply_on;  ///< where owners detect and receivers apply
  double setup_seconds = 0;
};

/// The in-process run's report: JSON with --json, else the summary over the steps (each step's
/// line was printed as it ran). Returns the exit status.
int report_in_process(const simulate_settings& s, const in_process_facts& facts,
                      const std::vector<step_result>& results, bool all_ok) {
  const auto& ps = s;
  const double rate = s.rate;
  const auto seed = s.seed;
  const int trainer_tp = s.trainer_tp, trainer_dp = s.trainer_dp, receiver_tp = s.receiver_tp;
  const auto trainer_layout = s.trainer_layout;
  const auto engine_layout = s.engine_layout;
  const auto tie = s.model.tie_embeddings;
  const auto& apply_path_text = s.apply_path_text;
  const auto& options = s.options;
  const int level = s.options.codec.zstd_level;
  const bool json = s.json;
  const auto checkpoint_bytes = facts.checkpoint_bytes;
  const auto& config = facts.config;
  const auto& coverage = facts.coverage;
  const auto& detect_on = facts.detect_on;
  const auto& apply_on = facts.apply_on;
  const auto residual_tasks = facts.residual_tasks;
  const auto setup_seconds = facts.setup_seconds;
  // ---- Report.
  if (json) {
    ojson out;
    out["checkpoint_bytes"] = checkpoint_bytes;
    out["canonical_tensors"] = facts.canonical_tensors;
    out["config"] = {{"dtype", std::string(dcr::dtype_name(config.type))},
                     {"layers", config.layers},
                     {"hidden", config.hidden},
                     {"experts", config.experts},
                     {"trainer_tp", trainer_tp},
                     {"trainer_dp", trainer_dp},
                     {"receiver_tp", receiver_tp},
                     {"change_rate", rate},
                     {"seed", seed},
                     {"encoding", policy_name(options.policy)},
                     {"zstd_level", level},
                     {"trainer_layout", dcr::sim::layout_name(trainer_layout)},
                     {"engine_layout", dcr::sim::layout_name(engine_layout)},
                     {"tie_embeddings", dcr::sim::tie_name(tie)},
                     {"apply_path", apply_path_text}};
    out["apply_path"] = apply_path_text;
    out["affine_share"] = coverage.affine_share();
    out["coverage"] = {{"affine_bytes", coverage.affine_bytes},
                       {"residual_bytes", coverage.residual_bytes},
                       {"uncovered_bytes", coverage.uncovered_bytes}};
    out["residual_tasks"] = residual_tasks;
    out["overwrite_only_tensors"] = facts.overwrite_only_tensors;
    out["device"] = {{"requested", dcr::exec::device_name(ps.device)},
                     {"description", ps.device_description}};
    out["stage_devices"] = {{"detect", detect_on}, {"project", detect_on},
                            {"tracker_update", detect_on}, {"residual", "cpu"},
                            {"encode", "cpu"},     {"compress", "cpu"},
                            {"decode", "cpu"},     {"apply", apply_on},
                            {"verify", "cpu"}};
    out["setup_seconds"] = setup_seconds;
    ojson& steps_json = out["steps"] = ojson::array();
    for (const auto& r : results) {
      std::uint64_t bytes = 0, payloads = 0;
      for (const auto& a : r.report.attempts) {
        bytes += a.payload_bytes;
        payloads += a.payloads;
      }
      const auto& last = r.report.attempts.back();
      const std::uint64_t changed = changed_elements(last);
      ojson failures = ojson::array();
      for (const auto& a : r.report.attempts)
        if (!a.failure.empty()) failures.push_back(a.failure);
      ojson step{{"step", r.step},
                 {"bit_exact", r.bit_exact},
                 {"committed", r.committed},
                 {"attempts", r.report.attempts.size()},
                 {"payloads", payloads},
                 {"payload_bytes", bytes},
                 {"changed_elements", changed},
                 {"residual_changed_elements", last.owners.residual_changed_elements},
                 {"records", last.records},
                 {"residual_items", last.owners.residual_items},
                 {"forced_overwrite_items", last.owners.forced_overwrite_items},
                 {"bytes_per_changed", changed ? static_cast<double>(bytes) / changed : 0.0},
                 {"ratio_to_checkpoint", static_cast<double>(bytes) / checkpoint_bytes},
                 {"seconds",
                  {{"refit", r.report.seconds},
                   {"waiting_for_candidates", r.candidates_seconds},
                   {"detect", last.owners.detect_seconds},
                   {"project", last.owners.project_seconds},
                   {"residual", residual_seconds(last)},
                   {"encode", last.owners.encode_seconds},
                   {"compress", last.compress_seconds},
                   {"apply", last.apply_seconds},
                   {"commit", last.commit_seconds},
                   {"verify", r.verify_seconds},
                   {"step", r.wall_seconds}}},
                 {"failures", std::move(failures)}};
      if (!r.mismatch.empty()) step["mismatch"] = r.mismatch;
      steps_json.push_back(std::move(step));
    }
    out["all_bit_exact"] = all_ok;
    // Invalid UTF-8 in a message (bytes from a payload, say) becomes U+FFFD, never an exception.
    fmt::print("{}\n", out.dump(2, ' ', false, ojson::error_handler_t::replace));
  } else if (!results.empty()) {
    std::uint64_t changed = 0, bytes = 0, records = 0;
    double detect = 0, project = 0, residual = 0, encode = 0, compress = 0, apply = 0, commit = 0,
           verify = 0;
    for (const auto& r : results) {
      for (const auto& a : r.report.attempts) {
        bytes += a.payload_bytes;
        detect += a.owners.detect_seconds;
        project += a.owners.project_seconds;
        residual += residual_seconds(a);
        encode += a.owners.encode_seconds;
        compress += a.compress_seconds;
        apply += a.apply_seconds;
        commit += a.commit_seconds;
      }
      changed += changed_elements(r.report.attempts.back());
      records += r.report.attempts.back().records;
      verify += r.verify_seconds;
    }
    const double n = static_cast<double>(results.size());
    fmt::print("\nsummary over {} step(s)\n", results.size());
    fmt::print("  {:<34} {:>16}\n", "checkpoint bytes", checkpoint_bytes);
    fmt::print("  {:<34} {:>15.2f}%\n", "affine share of checkpoint bytes",
               100.0 * coverage.affine_share());
    fmt::print("  {:<34} {:>16}\n", "overwrite-only tensors", facts.overwrite_only_tensors);
    fmt::print("  {:<34} {:>16}\n", "apply path", apply_path_text);
    fmt::print("  {:<34} {:>16.0f}\n", "changed elements / step", changed / n);
    fmt::print("  {:<34} {:>16.0f}\n", "records / step", records / n);
    fmt::print("  {:<34} {:>16.0f}\n", "payload bytes / step", bytes / n);
    fmt::print("  {:<34} {:>16.3f}\n", "bytes per changed element",
               changed ? static_cast<double>(bytes) / changed : 0.0);
    fmt::print("  {:<34} {:>15.3f}%\n", "payload / checkpoint", 100.0 * bytes / n / checkpoint_bytes);
    fmt::print("  {:<34} {:>15.1f}x\n", "fewer bytes than full checkpoint",
               bytes ? checkpoint_bytes * n / bytes : 0.0);
    fmt::print("  stage seconds / step: detect {:.3f}  project {:.3f}  residual {:.3f}  encode {:.3f}"
               "  compress {:.3f}  apply {:.3f}  commit {:.3f}  (verify {:.3f})\n",
               detect / n, project / n, residual / n, encode / n, compress / n, apply / n,
               commit / n, verify / n);
    fmt::print("  result: {}\n", all_ok ? "every step bit-exact" : "NOT bit-exact");
  }
  return all_ok ? 0 : 1;
}

int run_in_process(const simulate_settings& s) {
  // The settings under the names the report uses.
  const auto& ps = s;
  const auto steps = s.steps;
  const double rate = s.rate;
  const auto seed = s.seed;
  const int trainer_tp = s.trainer_tp, trainer_dp = s.trainer_dp, receiver_tp = s.receiver_tp;
  const auto trainer_layout = s.trainer_layout;
  const auto engine_layout = s.engine_layout;
  const auto tie = s.model.tie_embeddings;
  const auto path = s.path;
  const auto& apply_path_text = s.apply_path_text;
  const auto& options = s.options;
  const auto& fault_text = s.fault;
  const auto fault_step = s.fault_step;
  const bool json = s.json;
  // ---- Model, trainer, owners, receivers (dense-loaded with version 0), commit record.
  const auto setup_start = clock_type::now();
  dcr::sim::deployment_options setup;
  setup.model = s.model;
  setup.trainer = trainer_layout;
  setup.engine = engine_layout;
  setup.path = path;
  setup.trainer_tp = trainer_tp;
  setup.trainer_dp = trainer_dp;
  setup.receiver_tp = receiver_tp;
  setup.seed = seed;
  dcr::sim::in_process_deployment deployment(setup);
  deployment.start();
  // --device cuda: every owner detects, every receiver applies on the GPU (device copies of
  // trackers and storage; the storage is copied back before each verification).
  std::vector<std::unique_ptr<dcr::detect_backend>> device_detect;
  std::vector<std::unique_ptr<dcr::mirrored_apply_backend>> device_apply;
  for (std::size_t k = 0; k < deployment.owner_count(); ++k)
    if (auto b = make_detect_backend(ps.device, static_cast<int>(k))) {
      deployment.owner_at(k).set_detect_backend(b.get());
      device_detect.push_back(std::move(b));
    }
  for (std::size_t r = 0; r < deployment.receiver_count(); ++r)
    if (auto b = make_apply_backend(ps.device, deployment.storage_at(r).buffers(),
                                    static_cast<int>(r))) {
      b->upload_storage();
      deployment.receiver_at(r).set_apply_backend(b.get());
      device_apply.push_back(std::move(b));
    }
  const std::string detect_on =
      deployment.owner_count() ? deployment.owner_at(0).detect_device() : "cpu";
  const std::string apply_on =
      deployment.receiver_count() ? deployment.receiver_at(0).apply_device() : "cpu";
  const auto& config = setup.model;
  const auto& registry = deployment.registry();
  const double setup_seconds = seconds_since(setup_start);

  const auto checkpoint_bytes = static_cast<std::uint64_t>(registry.total_bytes());
  const dcr::task_coverage coverage = deployment.coverage();
  const auto overwrite_only = deployment.overwrite_only_tensors();
  const std::size_t residual_tasks = deployment.trainer().residual().size();
  if (!json) {
    fmt::print("dcr simulate: {} canonical tensors, {:.1f} MB {} checkpoint ({} layers, hidden {}, "
               "{} experts, tied embeddings: {})\n",
               registry.size(), checkpoint_bytes / 1e6, dcr::dtype_name(config.type),
               config.layers, config.hidden, config.experts, dcr::sim::tie_name(tie));
    fmt::print("  trainer TP={} DP={} {} layout ({} owners, {} residual tasks, affine share {:.2f}% "
               "of checkpoint bytes)\n",
               trainer_tp, trainer_dp, dcr::sim::layout_name(trainer_layout),
               deployment.owner_count(), residual_tasks, 100.0 * coverage.affine_share());
    fmt::print("  receivers TP={} {} layout, {} apply path ({} overwrite-only tensors), change "
               "rate {}, setup {:.2f} s\n",
               receiver_tp, dcr::sim::layout_name(engine_layout), apply_path_text,
               overwrite_only.size(), rate, setup_seconds);
    fmt::print("  device {}: detect, project, tracker update on {}; apply on {}; residual, "
               "encode, compress, decode, verify on cpu\n",
               ps.device_description, detect_on, apply_on);
  }

  // ---- Steps.
  std::vector<step_result> results;
  bool all_ok = true;
  for (std::int64_t step = 1; step <= steps; ++step) {
    const auto step_start = clock_type::now();
    step_result res;
    res.step = static_cast<std::uint64_t>(step);
    deployment.trainer().stress_step(rate);
    res.candidates_seconds = seconds_since(step_start);
    using dcr::testing::delivery_fault;
    dcr::testing::receiver_fault_plan faults;
    if (step == fault_step && fault_text != "none") {
      faults = [&](std::uint32_t attempt, std::size_t receiver, std::uint64_t ordinal) {
        if (attempt != 0 || receiver != 0 || ordinal != 0) return delivery_fault::none;
        if (fault_text == "duplicate") return delivery_fault::duplicate;
        if (fault_text == "corrupt") return delivery_fault::corrupt;
        return delivery_fault::drop;
      };
    }
    res.report = deployment.refit(options, faults);
    res.committed = res.report.committed;

    // Verify: dense refit of the same candidate weights through the same loader.
    const auto verify_start = clock_type::now();
    for (auto& a : device_apply) a->download_storage();
    res.mismatch = res.committed ? deployment.verify_against_dense_refit() : "not committed";
    res.bit_exact = res.mismatch.empty();
    res.verify_seconds = seconds_since(verify_start);
    res.wall_seconds = seconds_since(step_start);
    all_ok = all_ok && res.bit_exact;

    if (!json) {
      std::uint64_t bytes = 0;
      for (const auto& a : res.report.attempts) bytes += a.payload_bytes;
      const std::uint64_t changed = changed_elements(res.report.attempts.back());
      fmt::print("step {:>3}: {:>11} changed  {:>12} payload bytes  {:.3f} B/changed  "
                 "{} attempt(s)  refit {:.3f} s  (candidates {:.3f} s)  {}{}\n",
                 step, changed, bytes, changed ? static_cast<double>(bytes) / changed : 0.0,
                 res.report.attempts.size(), res.report.seconds, res.candidates_seconds,
                 res.bit_exact ? "bit-exact" : "MISMATCH",
                 res.mismatch.empty() ? "" : " (" + res.mismatch + ")");
      for (const auto& a : res.report.attempts)
        if (!a.failure.empty())
          fmt::print("          attempt {} failed: {}\n", a.attempt, a.failure);
    }
    results.push_back(std::move(res));
  }

  return report_in_process(s,
                           {checkpoint_bytes, registry.size(), config, coverage,
                            overwrite_only.size(), residual_tasks, detect_on, apply_on,
                            setup_seconds},
                           results, all_ok);
}

}  // namespace

int simulate_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", usage);
    return 0;
  }
  simulate_settings s;
  s.argv = argv;
  s.json = args.flag("--json");
  parse_model_flags(args, s);
  parse_transport_flags(args, s);
  parse_run_flags(args, s);
  parse_disruption_flags(args, s);
  parse_agent_flags(args, s);
  const bool in_process = args.flag("--in-process") || s.commit == "memory";
  args.finish();
  check_modes(s, in_process);
  if (const auto refused = refuse_unavailable_device(s)) return *refused;
  if (in_process) return run_in_process(s);
  if (!s.role.empty()) return run_simulate_agent(s);
  return run_simulate_processes(s);
}

}  // namespace dcr_tool
