// tools/dcr/simulate_transport.hpp: the payload transport of `dcr simulate` across processes,
// one function per side, so that each transport (--store DIR today) is one branch in each:
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
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "dcr/protocol/link_shaper.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "simulate_processes.hpp"

namespace dcr_tool {

/// The filesystem payload store's directory: --store DIR, or DIR/store of the work directory.
inline std::string store_dir(const simulate_settings& s) {
  return s.store.empty() ? (std::filesystem::path(s.workdir) / "store").string() : s.store;
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

template <class F>
int with_owner_store(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  auto& flow = cross_cluster_flow(s, "trainer-node-" + std::to_string(trainer_node_of(s, s.id)));
  shaped_store<dcr::file_payload_store> shaped(store, &flow, nullptr);
  return f(shaped);
}

template <class F>
int with_coordinator_store(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  return f(store);
}

template <class F>
int with_receiver_source(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  auto& flow = cross_cluster_flow(s, "rollout-node-" + std::to_string(rollout_node_of(s, s.id)));
  shaped_store<dcr::file_payload_store> shaped(store, nullptr, &flow);
  dcr::store_source<shaped_store<dcr::file_payload_store>> source(shaped);
  return f(source);
}

/// The object storage of the full-checkpoint reference (simulate_reference.hpp): the transport's
/// store where it is object storage, else a filesystem store; in a place of its own.
template <class F>
int with_reference_store(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(std::filesystem::path(s.workdir) / "reference");
  return f(store);
}

}  // namespace dcr_tool
