// tools/dcr/simulate_reference.cpp: the full-checkpoint reference (see simulate_reference.hpp).
#include "simulate_reference.hpp"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "dcr/sim/moe_model.hpp"
#include "simulate_transport.hpp"

namespace dcr_tool {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Runs body(node) on one thread per node; rethrows the first failure.
template <class F>
void on_threads(int nodes, F&& body) {
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex m;
  for (int n = 0; n < nodes; ++n)
    threads.emplace_back([&, n] {
      try {
        body(n);
      } catch (...) {
        std::lock_guard lock(m);
        if (!failure) failure = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

reference_result run_reference(const simulate_settings& s, std::uint64_t version) {
  const dcr::tensor_registry registry(s.model.canonical_tensors());
  const dcr::sim::synthetic_trainer model(s.model, registry, s.trainer_tp, s.trainer_dp, s.seed,
                                          s.trainer_layout, dcr::sim::trainer_selection::none());
  const dcr::sim::stress_schedule schedule(s.rate);
  const auto object_bytes = static_cast<std::size_t>(std::max<std::uint64_t>(s.options.bucket_bytes, 1));
  const dcr::attempt_key key{0, 0, 0};
  reference_result out;
  out.checkpoint_bytes = static_cast<std::uint64_t>(registry.total_bytes());
  std::vector<std::uint64_t> uploaded_digest(static_cast<std::size_t>(s.trainer_nodes), 0);
  std::vector<dcr::link_shaper*> up(static_cast<std::size_t>(s.trainer_nodes));
  std::vector<dcr::link_shaper*> down(static_cast<std::size_t>(s.rollout_nodes));
  for (int n = 0; n < s.trainer_nodes; ++n)
    up[static_cast<std::size_t>(n)] = &cross_cluster_flow(s, "reference-trainer-node-" + std::to_string(n));
  for (int n = 0; n < s.rollout_nodes; ++n)
    down[static_cast<std::size_t>(n)] = &cross_cluster_flow(s, "reference-rollout-node-" + std::to_string(n));
  const auto flows0 = flow_bytes();
  // Each trainer node's share, generated before the clock starts (a trainer holds its
  // checkpoint already): its tensors, in registry order.
  std::vector<std::vector<std::byte>> shares(static_cast<std::size_t>(s.trainer_nodes));
  on_threads(s.trainer_nodes, [&](int node) {
    auto& share = shares[static_cast<std::size_t>(node)];
    for (std::size_t id = static_cast<std::size_t>(node); id < registry.size();
         id += static_cast<std::size_t>(s.trainer_nodes)) {
      const auto& t = registry.at(static_cast<dcr::tensor_id>(id));
      const auto at = share.size();
      share.resize(at + static_cast<std::size_t>(t.bytes()));
      model.canonical_at(static_cast<dcr::tensor_id>(id), version, schedule,
                         std::span(share).subspan(at, static_cast<std::size_t>(t.bytes())));
    }
  });
  with_reference_store(s, [&](auto& store) {
    using store_type = std::remove_reference_t<decltype(store)>;
    const auto t0 = std::chrono::steady_clock::now();
    // Uploads: each trainer node its share, in objects of at most object_bytes.
    on_threads(s.trainer_nodes, [&](int node) {
      shaped_store<store_type> shaped(store, up[static_cast<std::size_t>(node)], nullptr);
      const auto& share = shares[static_cast<std::size_t>(node)];
      std::vector<dcr::payload_id> ids;
      std::uint32_t sequence = 0;
      std::uint64_t digest = 0;
      for (std::size_t at = 0; at < share.size(); at += object_bytes) {
        const std::span<const std::byte> piece(share.data() + at, std::min(object_bytes, share.size() - at));
        const dcr::payload_id pid{{0, 0, 0}, static_cast<std::uint32_t>(node), sequence++};
        shaped.put(pid, piece);
        digest += XXH64(piece.data(), piece.size(), pid.sequence);
        ids.push_back(pid);
      }
      shaped.put_manifest(key, static_cast<std::uint32_t>(node), ids);
      uploaded_digest[static_cast<std::size_t>(node)] = digest;
    });
    const auto t1 = std::chrono::steady_clock::now();
    std::uint64_t expected = 0;
    for (auto d : uploaded_digest) expected += d;
    // Downloads: every rollout node all of it; each checks what it got against the uploads.
    on_threads(s.rollout_nodes, [&](int node) {
      shaped_store<store_type> shaped(store, nullptr, down[static_cast<std::size_t>(node)]);
      std::vector<std::byte> bytes;
      std::uint64_t digest = 0;
      for (const auto& listing : shaped.list(key)) {
        DCR_EXPECTS(listing.complete, dcr::errc::transport_failure,
                    "reference: trainer node " + std::to_string(listing.owner) + "'s upload is incomplete");
        for (const auto& pid : listing.ids) {
          DCR_EXPECTS(shaped.get(pid, bytes) == dcr::get_status::found, dcr::errc::transport_failure,
                      "reference: object " + std::to_string(pid.sequence) + " of trainer node " +
                          std::to_string(pid.owner) + " is missing");
          digest += XXH64(bytes.data(), bytes.size(), pid.sequence);
        }
      }
      DCR_EXPECTS(digest == expected, dcr::errc::verification_failed,
                  "reference: rollout node " + std::to_string(node) +
                      " downloaded other bytes than the trainer nodes uploaded");
    });
    const auto t2 = std::chrono::steady_clock::now();
    out.upload_seconds = seconds_between(t0, t1);
    out.download_seconds = seconds_between(t1, t2);
    out.seconds = seconds_between(t0, t2);
    store.erase_through(0);
  });
  std::uint64_t busiest_up = 0, busiest_down = 0;
  for (const auto& [name, bytes] : flow_bytes_since(flows0)) {
    out.bytes_crossing += bytes;
    auto& busiest = name.rfind("reference-trainer", 0) == 0 ? busiest_up : busiest_down;
    busiest = std::max(busiest, bytes);
  }
  if (s.link_rate > 0) out.transport_seconds = static_cast<double>(busiest_up + busiest_down) / s.link_rate;
  return out;
}

}  // namespace dcr_tool
