// tools/dcr/simulate_transport.hpp: the payload transport of `dcr simulate` across processes,
// one function per side, so that each transport (--transport file, the filesystem store in
// --store DIR; --transport s3://BUCKET/PREFIX, an S3 store; --transport relay) is one branch in
// each:
//   with_owner_store(s, f)        f(store): what an owner agent puts its payloads into;
//   with_coordinator_store(s, f)  f(store): what the coordinator erases committed payloads from;
//   with_receiver_source(s, f)    f(source): what a receiver agent reads its payloads from.
// Each calls f with an object that lives for the whole call and returns what f returns.
//
// Cross-cluster flows: every byte that crosses between the trainer and the rollout cluster goes
// through the flow of the node it leaves or enters, a dcr::link_shaper shared by the processes
// of that node (WORKDIR/links/<flow>.link: "trainer-node-N", "rollout-node-N"), shaped to
// --link-rate; the parent reads the flows' counters for bytes_crossing and the transport lower
// bound. A pull store is crossed twice: the owner's put leaves its trainer node, and each
// receiver's get enters its rollout node.
//
// S3 (--transport s3://BUCKET/PREFIX --s3-endpoint URL, credentials from the AWS environment
// variables): every process opens its own s3_payload_store under PREFIX/<work directory
// name>/, so runs never share objects; the parent checks access before it starts anything
// (a wrong secret stops the run there, nothing started, nothing committed) and erases the
// run's objects at the end unless --keep. Receivers read through a prefetch_source
// (--s3-parallel-gets gets in flight). With --s3-fanout, the rollout nodes split each
// attempt's payloads (dcr::fanout_store): the receiver that claims a payload of its node's
// share downloads it (booked on its rollout node's flow) and forwards it into WORKDIR/fanout,
// a file store standing for the rollout cluster's local network, where every other receiver
// reads it without crossing the boundary.
// --transport relay (dcr/protocol/relay/relay.hpp): the parent starts --relay-roots root processes
// (role relay-root, listening on 127.0.0.1:BASE+k) and each receiver process hosts the relay
// node of its own rank (127.0.0.1:BASE+roots+rank), so a root forwards to every receiver process
// over loopback, the local links (unshaped). The cross-cluster flows are the owners'
// connections to the roots: "relay-root-K" (with --relay-flows F > 1, "relay-root-K-F", owner o
// on flow o mod F), booked by the owners as they write, so each byte is counted once. Every
// peer authenticates with the certificates in --relay-certs (DIR/ca.pem, DIR/{owner,root,node}
// .pem and .key); without it the parent makes a throwaway CA in WORKDIR/certs with
// scripts/make-test-certs.sh.
#pragma once

#include <fmt/core.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dcr/protocol/store/fanout_store.hpp"
#include "dcr/protocol/link_shaper.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "dcr/protocol/relay/relay.hpp"
#include "simulate_processes.hpp"

namespace dcr_tool {

/// The filesystem payload store's directory: --store DIR, or DIR/store of the work directory.
inline std::string store_dir(const simulate_settings& s) {
  return s.store.empty() ? (std::filesystem::path(s.workdir) / "store").string() : s.store;
}

/// Whether payloads go through S3 (--transport s3://...).
inline bool uses_s3(const simulate_settings& s) { return s.transport.rfind("s3://", 0) == 0; }

/// The S3 store options of this run: the --transport URL's bucket and prefix, plus the work
/// directory's name when `run_prefix` (what every agent uses; the parent's access check uses
/// the bare prefix, before the work directory exists), credentials and region from the
/// environment unless --s3-region is given.
inline dcr::s3_options s3_options_of(const simulate_settings& s, bool run_prefix = true) {
  auto o = dcr::s3_options::from_environment(s.transport, s.s3_endpoint);
  if (!s.s3_region.empty()) o.region = s.s3_region;
  if (s.s3_addressing == "path") o.addressing = dcr::s3_addressing::path;
  if (s.s3_addressing == "virtual") o.addressing = dcr::s3_addressing::virtual_host;
  o.multipart_threshold = static_cast<std::size_t>(s.s3_multipart_mb) << 20;
  if (run_prefix) o.prefix += std::filesystem::path(s.workdir).filename().string() + "/";
  return o;
}

/// Where payloads go, for the report: the store directory, or s3://BUCKET/PREFIX/RUN/.
inline std::string transport_description(const simulate_settings& s) {
  return uses_s3(s) ? "s3://" + s3_options_of(s).bucket + "/" + s3_options_of(s).prefix : store_dir(s);
}

/// The parent, before it starts any process: throws (errc::transport_failure, naming the
/// bucket, the HTTP status and S3's error code) if S3 refuses this run's credentials.
inline void check_transport(const simulate_settings& s) {
  if (!uses_s3(s)) return;
  dcr::s3_payload_store store(s3_options_of(s, false));
  store.check_access();
}

/// The parent, at the end: erases what is left of the run in S3 (nothing after a clean run:
/// the coordinator erases each committed transition).
inline void clean_transport(const simulate_settings& s) {
  if (!uses_s3(s)) return;
  dcr::s3_payload_store store(s3_options_of(s));
  store.erase_through(std::numeric_limits<std::uint64_t>::max());
}

/// WORKDIR/fanout: the rollout cluster's local copies (store/) and claims (claims/).
inline std::filesystem::path fanout_dir(const simulate_settings& s) {
  return std::filesystem::path(s.workdir) / "fanout";
}

/// The node of trainer rank `rank` (an owner process) and of receiver rank `rank`.
inline int trainer_node_of(const simulate_settings& s, int rank) {
  return rank % s.trainer_nodes;
}
inline int rollout_node_of(const simulate_settings& s, int rank) { return rank % s.rollout_nodes; }

/// Where the flows' shared state lives.
inline std::filesystem::path links_dir(const simulate_settings& s) {
  return std::filesystem::path(s.workdir) / "links";
}
/// This process's handles on the flows it uses, by flow name.
inline std::map<std::string, dcr::link_shaper>& process_flows() {
  static std::map<std::string, dcr::link_shaper> flows;
  return flows;
}
/// The cross-cluster flow named `flow` ("trainer-node-0", "rollout-node-3", "relay-root-1"):
/// this process's one handle on it, opened on first use.
inline dcr::link_shaper& cross_cluster_flow(const simulate_settings& s, const std::string& flow) {
  auto& flows = process_flows();
  if (auto it = flows.find(flow); it != flows.end()) return it->second;
  std::filesystem::create_directories(links_dir(s));
  return flows.emplace(flow, dcr::link_shaper::shared(links_dir(s) / (flow + ".link"), s.link_rate))
      .first->second;
}
/// Bytes this process has booked on each of its flows so far.
inline std::map<std::string, std::uint64_t> flow_bytes() {
  std::map<std::string, std::uint64_t> out;
  for (const auto& [name, flow] : process_flows()) out[name] = flow.local_bytes();
  return out;
}
/// What `after` adds to `before` (both from flow_bytes()).
inline std::map<std::string, std::uint64_t> flow_bytes_since(
    const std::map<std::string, std::uint64_t>& before) {
  auto out = flow_bytes();
  for (auto& [name, bytes] : out)
    if (auto it = before.find(name); it != before.end()) bytes -= it->second;
  return out;
}

/// A pull store whose puts leave through one flow and whose gets enter through another (either
/// may be null: not crossing). Bytes are booked in 64 KiB pieces as they would go out.
template <dcr::payload_store Store>
class shaped_store {
 public:
  using payload_store_concept = dcr::payload_store_tag;

  shaped_store(Store& inner, dcr::link_shaper* put_flow, dcr::link_shaper* get_flow)
      : inner_(&inner), put_flow_(put_flow), get_flow_(get_flow) {}

  void put(const dcr::payload_id& id, std::span<const std::byte> bytes) {
    book(put_flow_, bytes.size());
    inner_->put(id, bytes);
  }
  void put_manifest(const dcr::attempt_key& key, std::uint32_t owner,
                    std::span<const dcr::payload_id> ids) {
    book(put_flow_, ids.size() * sizeof(dcr::payload_id));
    inner_->put_manifest(key, owner, ids);
  }
  std::vector<dcr::owner_listing> list(const dcr::attempt_key& key) const { return inner_->list(key); }
  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out) const {
    const auto status = inner_->get(id, out);
    if (status == dcr::get_status::found) book(get_flow_, out.size());
    return status;
  }
  void erase_through(std::uint64_t version) { inner_->erase_through(version); }

 private:
  static void book(dcr::link_shaper* flow, std::size_t bytes) {
    if (flow == nullptr) return;
    constexpr std::size_t piece = 64 * 1024;
    for (std::size_t done = 0; done < bytes; done += piece) flow->consume(std::min(piece, bytes - done));
  }

  Store* inner_;
  dcr::link_shaper* put_flow_;
  dcr::link_shaper* get_flow_;
};

// ---- the relay

inline bool uses_relay(const simulate_settings& s) { return s.transport == "relay"; }

inline dcr::relay_endpoint relay_root_endpoint(const simulate_settings& s, int k) {
  return {"127.0.0.1", static_cast<std::uint16_t>(s.relay_port_base + k)};
}
inline dcr::relay_endpoint relay_node_endpoint(const simulate_settings& s, int rank) {
  return {"127.0.0.1", static_cast<std::uint16_t>(s.relay_port_base + s.relay_roots + rank)};
}
/// The cross-cluster flow owner `owner`'s connection to root `root` books on.
inline std::string relay_flow_name(const simulate_settings& s, int root, int owner) {
  std::string name = "relay-root-" + std::to_string(root);
  if (s.relay_flows > 1) name += "-" + std::to_string(owner % s.relay_flows);
  return name;
}
inline dcr::relay_tls relay_tls_of(const simulate_settings& s, const std::string& role) {
  return dcr::relay_tls::in_directory(s.relay_certs, role);
}
/// What a relay component reports: into WORKDIR/results/<role>-<id>.relay.log (each line after
/// its unix time), and refusals (an unauthenticated peer) to stderr as well.
inline std::function<void(const std::string&)> relay_log(const simulate_settings& s) {
  const auto path = std::filesystem::path(s.workdir) / "results" /
                    (s.role + "-" + std::to_string(s.id) + ".relay.log");
  const std::string who = s.role + " " + std::to_string(s.id);
  return [path, who](const std::string& line) {
    std::ofstream(path, std::ios::app) << fmt::format("{:.3f} ", dcr::unix_seconds_now()) << line << "\n";
    if (line.find("refused peer") != std::string::npos || line.find("refused this peer") != std::string::npos)
      fmt::print(stderr, "dcr simulate: {}: {}\n", who, line);
  };
}

/// A relay root process (role relay-root): forwards until SIGTERM, then writes its counters to
/// WORKDIR/results/relay-root-<id>.jsonl. `kill_at(id)`: whether to SIGKILL itself after
/// forwarding the first chunk of a payload with that id (--kill relay-root).
template <class KillAt>
int run_relay_root(const simulate_settings& s, KillAt kill_at) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the root's thread starts: it inherits it
  dcr::relay_root_options o;
  o.listen = relay_root_endpoint(s, s.id);
  for (int r = 0; r < s.receiver_tp; ++r) o.nodes.push_back(relay_node_endpoint(s, r));
  o.tls = relay_tls_of(s, "root");
  o.name = "relay root " + std::to_string(s.id);
  o.log = relay_log(s);
  o.after_first_chunk = [kill_at](const dcr::payload_id& id) {
    if (kill_at(id)) ::raise(SIGKILL);
  };
  dcr::relay_root root(o);
  int signal = 0;
  sigwait(&stop, &signal);
  const auto st = root.stats();
  const nlohmann::json j{{"payloads", st.payloads}, {"bytes_in", st.bytes_in},
                         {"bytes_forwarded", st.bytes_forwarded},
                         {"peak_buffered_bytes", st.peak_buffered_bytes}, {"refusals", st.refusals}};
  std::ofstream(std::filesystem::path(s.workdir) / "results" / ("relay-root-" + std::to_string(s.id) + ".jsonl"),
                std::ios::app)
      << j.dump() << "\n";
  return 0;
}

// ---- one function per side

template <class F>
int with_owner_store(const simulate_settings& s, F&& f) {
  if (uses_relay(s)) {
    dcr::relay_owner_options o;
    for (int k = 0; k < s.relay_roots; ++k) {
      o.roots.push_back(relay_root_endpoint(s, k));
      o.flows.push_back(&cross_cluster_flow(s, relay_flow_name(s, k, s.id)));
    }
    o.tls = relay_tls_of(s, "owner");
    o.name = "owner " + std::to_string(s.id);
    dcr::relay_owner_store store(o);
    return f(store);
  }
  auto& flow = cross_cluster_flow(s, "trainer-node-" + std::to_string(trainer_node_of(s, s.id)));
  if (uses_s3(s)) {
    dcr::s3_payload_store store(s3_options_of(s));
    shaped_store<dcr::s3_payload_store> shaped(store, &flow, nullptr);
    return f(shaped);
  }
  dcr::file_payload_store store(store_dir(s));
  shaped_store<dcr::file_payload_store> shaped(store, &flow, nullptr);
  return f(shaped);
}

template <class F>
int with_coordinator_store(const simulate_settings& s, F&& f) {
  if (uses_relay(s)) {  // the nodes drop an attempt's payloads when the next one is announced
    dcr::nothing_to_erase nothing;
    return f(nothing);
  }
  if (uses_s3(s)) {
    dcr::s3_payload_store store(s3_options_of(s));
    if (!s.s3_fanout) return f(store);
    // Erasing through the fan-out view drops the rollout cluster's copies and claims too.
    dcr::file_payload_store local(fanout_dir(s) / "store");
    dcr::directory_claims claims(fanout_dir(s) / "claims");
    dcr::fanout_store<dcr::s3_payload_store, dcr::file_payload_store> fan(store, local, claims, {});
    return f(fan);
  }
  dcr::file_payload_store store(store_dir(s));
  return f(store);
}

template <class F>
int with_receiver_source(const simulate_settings& s, F&& f) {
  if (uses_relay(s)) {
    dcr::relay_node_options o;
    o.listen = relay_node_endpoint(s, s.id);
    o.tls = relay_tls_of(s, "node");
    o.name = "relay node of r" + std::to_string(s.id);
    // A payload is at most about a bucket (one larger item makes one larger payload, admitted
    // alone): two buckets per root connection keep every root streaming.
    o.window_bytes = std::max<std::uint64_t>(std::uint64_t{16} << 20, 2 * std::uint64_t{s.options.bucket_bytes});
    o.log = relay_log(s);
    dcr::relay_node node(o);
    dcr::relay_node::source source(node, "r" + std::to_string(s.id));
    return f(source);
  }
  auto& flow = cross_cluster_flow(s, "rollout-node-" + std::to_string(rollout_node_of(s, s.id)));
  if (uses_s3(s)) {
    dcr::s3_payload_store store(s3_options_of(s));
    using shaped_t = shaped_store<dcr::s3_payload_store>;
    shaped_t shaped(store, nullptr, &flow);
    dcr::prefetch_options po;
    po.parallel_gets = static_cast<std::size_t>(s.s3_parallel_gets);
    po.poll_interval = std::chrono::milliseconds(20);  // a LIST request each, per receiver
    if (!s.s3_fanout) {
      dcr::prefetch_source<shaped_t> source(shaped, po);
      return f(source);
    }
    dcr::file_payload_store local(fanout_dir(s) / "store");
    dcr::directory_claims claims(fanout_dir(s) / "claims");
    dcr::fanout_options fo;
    fo.node = static_cast<std::uint32_t>(rollout_node_of(s, s.id));
    fo.nodes = static_cast<std::uint32_t>(s.rollout_nodes);
    using fan_t = dcr::fanout_store<shaped_t, dcr::file_payload_store>;
    fan_t fan(shaped, local, claims, fo);
    dcr::prefetch_source<fan_t> source(fan, po);
    return f(source);
  }
  dcr::file_payload_store store(store_dir(s));
  shaped_store<dcr::file_payload_store> shaped(store, nullptr, &flow);
  dcr::store_source<shaped_store<dcr::file_payload_store>> source(shaped);
  return f(source);
}

/// The object storage of the full-checkpoint reference (simulate_reference.hpp): the transport's
/// store where it is object storage, else a filesystem store; in a place of its own.
template <class F>
auto with_reference_store(const simulate_settings& s, F&& f) {
  if (uses_s3(s)) {  // the run's prefix, under reference/ (never an attempt directory of the refits)
    auto o = s3_options_of(s);
    o.prefix += "reference/";
    dcr::s3_payload_store store(o);
    return f(store);
  }
  dcr::file_payload_store store(std::filesystem::path(s.workdir) / "reference");
  return f(store);
}

}  // namespace dcr_tool
