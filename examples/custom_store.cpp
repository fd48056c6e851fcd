// examples/custom_store.cpp: a payload store of your own, under the real agents.
//
// A payload store is any type meeting dcr::payload_store (dcr/protocol/payload_store.hpp):
// put a payload once, put an owner's manifest for an attempt, list an attempt per owner, get,
// and erase what a commit made obsolete. Here it adapts a key-value blob service (a stand-in
// for whatever object or key-value storage a deployment already runs: a put-if-absent, a get,
// a prefix listing and an erase). The agents are the ones that run across processes: the
// coordinator, two owner agents and a receiver agent, each with its own handle on a file
// control plane in a fresh directory, on threads of this process. After one transition the
// receiver must hold the new weights bit for bit, and the commit must have erased every
// object of the transition from the service.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dcr/dcr.hpp"

namespace {

// ---- the service: what a deployment already has (here in memory, thread-safe)

class blob_service {
 public:
  /// Stores `bytes` under `key` unless the key exists; false if it did.
  bool put_if_absent(const std::string& key, std::span<const std::byte> bytes) {
    std::lock_guard lock(mutex_);
    return blobs_.try_emplace(key, bytes.begin(), bytes.end()).second;
  }
  std::optional<std::vector<std::byte>> get(const std::string& key) const {
    std::lock_guard lock(mutex_);
    const auto it = blobs_.find(key);
    if (it == blobs_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (auto it = blobs_.lower_bound(prefix); it != blobs_.end() && it->first.starts_with(prefix); ++it)
      out.push_back(it->first);
    return out;
  }
  void erase(const std::string& key) {
    std::lock_guard lock(mutex_);
    blobs_.erase(key);
  }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return blobs_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::vector<std::byte>> blobs_;
};

// ---- the adapter: dcr's payload store contract over the service
//
// Keys: dcr/<attempt>/o<owner>/p<sequence> for payloads and .../manifest for an owner's manifest
// (its sequence numbers, one per line, after a count), where <attempt> is dcr::to_string(key),
// "t<base>-<target>-a<number>", which dcr::parse_attempt_key reads back.

class blob_payload_store {
 public:
  using payload_store_concept = dcr::payload_store_tag;
  explicit blob_payload_store(blob_service& service) : service_(&service) {}

  void put(const dcr::payload_id& id, std::span<const std::byte> bytes) {
    const auto key = owner_prefix(id.attempt, id.owner) + "p" + std::to_string(id.sequence);
    if (service_->put_if_absent(key, bytes)) return;
    const auto have = service_->get(key);  // ids are immutable names: equal bytes are a no-op
    DCR_EXPECTS(have && std::equal(have->begin(), have->end(), bytes.begin(), bytes.end()),
                dcr::errc::transport_failure, "blob store: '" + key + "' put again with other bytes");
  }

  void put_manifest(const dcr::attempt_key& key, std::uint32_t owner,
                    std::span<const dcr::payload_id> ids) {
    std::string text = std::to_string(ids.size()) + "\n";
    for (const auto& id : ids) {
      DCR_EXPECTS(id.attempt == key && id.owner == owner &&
                      service_->get(owner_prefix(key, owner) + "p" + std::to_string(id.sequence)),
                  dcr::errc::transport_failure,
                  "blob store: a manifest lists a payload that was not put for its attempt");
      text += std::to_string(id.sequence) + "\n";
    }
    const auto at = owner_prefix(key, owner) + "manifest";
    service_->erase(at);  // a manifest is replaced whole (an owner's retry of its last step)
    service_->put_if_absent(at, std::as_bytes(std::span(text)));
  }

  std::vector<dcr::owner_listing> list(const dcr::attempt_key& key) const {
    std::map<std::uint32_t, dcr::owner_listing> by_owner;
    const auto prefix = attempt_prefix(key);
    for (const auto& k : service_->keys_with_prefix(prefix)) {
      // o<owner>/p<sequence> or o<owner>/manifest
      const auto rest = k.substr(prefix.size());
      const auto slash = rest.find('/');
      const auto owner = static_cast<std::uint32_t>(std::stoul(rest.substr(1, slash - 1)));
      const auto leaf = rest.substr(slash + 1);
      auto& l = by_owner[owner];
      l.owner = owner;
      if (leaf == "manifest") continue;  // read below, once all keys are seen
      l.ids.push_back({key, owner,
                       static_cast<std::uint32_t>(std::stoul(leaf.substr(1)))});
    }
    std::vector<dcr::owner_listing> out;
    for (auto& [owner, l] : by_owner) {
      if (const auto m = service_->get(owner_prefix(key, owner) + "manifest")) {
        const std::string text(reinterpret_cast<const char*>(m->data()), m->size());
        l.ids.clear();
        std::size_t at = text.find('\n') + 1;
        for (std::size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
          l.ids.push_back({key, owner,
                           static_cast<std::uint32_t>(std::stoul(text.substr(at, nl - at)))});
        DCR_EXPECTS(l.ids.size() == std::stoul(text.substr(0, text.find('\n'))),
                    dcr::errc::transport_failure, "blob store: a damaged manifest");
        l.complete = true;
      }
      std::sort(l.ids.begin(), l.ids.end());
      out.push_back(std::move(l));
    }
    return out;  // by owner ascending (std::map order)
  }

  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out) const {
    const auto bytes =
        service_->get(owner_prefix(id.attempt, id.owner) + "p" + std::to_string(id.sequence));
    if (!bytes) return dcr::get_status::absent;  // not put yet, or erased: never an error
    out = *bytes;
    return dcr::get_status::found;
  }

  void erase_through(std::uint64_t version) {
    for (const auto& k : service_->keys_with_prefix("dcr/t")) {
      const auto attempt = dcr::parse_attempt_key(k.substr(4, k.find('/', 4) - 4));
      if (attempt && attempt->target_version <= version) service_->erase(k);
    }
  }

 private:
  static std::string attempt_prefix(const dcr::attempt_key& key) {
    return "dcr/" + dcr::to_string(key) + "/";
  }
  static std::string owner_prefix(const dcr::attempt_key& key, std::uint32_t owner) {
    return attempt_prefix(key) + "o" + std::to_string(owner) + "/";
  }
  blob_service* service_;
};
static_assert(dcr::payload_store<blob_payload_store>);

// ---- the model: one BF16 matrix, row-split over two training ranks; the engine keeps it whole

constexpr std::int64_t rows = 8, cols = 4;

struct engine_loader {
  using loader_concept = dcr::loader_tag;
  std::vector<std::uint16_t>* storage;
  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    sink.copy(dcr::tensor_view<W>::contiguous(reinterpret_cast<W*>(storage->data()), t.shape), src);
  }
};

}  // namespace

int main() {
  using plane_t = dcr::file_control_plane;
  using store_t = blob_payload_store;
  const dcr::tensor_registry registry({{"w", dcr::dtype::bf16, {rows, cols}}});
  const auto deadline = dcr::protocol_clock::now() + std::chrono::seconds(20);

  // The control plane: a directory every agent opens on its own (as separate processes would).
  std::string dir_template = (std::filesystem::temp_directory_path() / "dcr-custom-store-XXXXXX").string();
  DCR_EXPECTS(mkdtemp(dir_template.data()) != nullptr, dcr::errc::io_error, "mkdtemp failed");
  const std::filesystem::path dir = dir_template;
  plane_t::create(dir);
  plane_t coordinator_plane(dir), owner_planes[2] = {plane_t(dir), plane_t(dir)}, receiver_plane(dir);
  blob_service service;
  store_t store(service);

  // Trainer: two ranks, a row split each.
  std::vector<std::uint16_t> shards[2];
  std::vector<std::unique_ptr<dcr::owner>> owners;
  for (int r = 0; r < 2; ++r) {
    dcr::affine_task task;
    task.shard_name = "w.tp" + std::to_string(r);
    task.mapping = dcr::row_split(registry.at(0).shape, 2, r);
    task.targets = {0};
    shards[r].resize(task.local_size());
    for (std::size_t j = 0; j < shards[r].size(); ++j)
      shards[r][j] = dcr::float_to_bf16(0.25f * static_cast<float>(j) + static_cast<float>(r));
    owners.push_back(std::make_unique<dcr::owner>(registry, r, std::vector{task}));
    const std::span<const std::byte> committed[] = {std::as_bytes(std::span(shards[r]))};
    owners.back()->initialize(committed);
  }
  auto canonical = [&] {
    std::vector<std::uint16_t> w(shards[0]);
    w.insert(w.end(), shards[1].begin(), shards[1].end());
    return w;
  };

  // Receiver: the engine loaded densely with version 0.
  std::vector<std::uint16_t> storage(rows * cols);
  engine_loader loader{&storage};
  dcr::receiver<engine_loader> rx(registry, loader);
  rx.prewarm();
  {
    const auto w = canonical();
    rx.dense_load<std::uint16_t>(0, dcr::tensor_view<const std::uint16_t>::contiguous(w.data(), {rows, cols}));
  }

  bool ok = false;
  {  // The agents (their leases are revoked when they go, before the directory is removed).
    dcr::coordinator_options co;
    co.min_receivers = 1;
    dcr::coordinator<plane_t, store_t> coordinator(coordinator_plane, store, registry.fingerprint(),
                                                   {0, 1}, co);
    coordinator.initialize(0, deadline);
    std::vector<std::unique_ptr<dcr::owner_agent<plane_t, store_t>>> owner_agents;
    for (int r = 0; r < 2; ++r) {
      owner_agents.push_back(std::make_unique<dcr::owner_agent<plane_t, store_t>>(
          *owners[r], registry, owner_planes[r], store));
      owner_agents.back()->start(0, deadline);
    }
    dcr::store_source<store_t> source(store);
    dcr::receiver_agent<plane_t, dcr::store_source<store_t>> receiver_agent(
        "rank-0", rx, registry.fingerprint(), receiver_plane, source);
    receiver_agent.start(0, /*restored=*/true, deadline);

    // One optimizer step, then the transition 0 -> 1. Each agent reports a failure as a
    // dcr::error (e.g. the deadline passing).
    shards[0][2] ^= 0x0001;
    shards[1][7] ^= 0x8000;
    auto report = [](const char* who, const dcr::error& e) { std::printf("%s: %s\n", who, e.what()); };
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        const std::span<const std::byte> candidates[] = {std::as_bytes(std::span(shards[r]))};
        try {
          owner_agents[r]->serve_transition("step 1", candidates, {}, deadline);
        } catch (const dcr::error& e) {
          report("owner agent", e);
        }
      });
    threads.emplace_back([&] {
      try {
        receiver_agent.serve_until(1, deadline);
      } catch (const dcr::error& e) {
        report("receiver agent", e);
      }
    });
    dcr::transition_summary summary;
    try {
      summary = coordinator.run_transition("step 1", deadline);
    } catch (const dcr::error& e) {
      report("coordinator", e);
    }
    for (auto& t : threads) t.join();

    const bool exact = storage == canonical();
    std::printf("committed: %s in %zu attempt(s); receiver %s; %zu object(s) left in the service\n",
                summary.committed ? "yes" : "no", summary.attempts.size(),
                exact ? "bit-identical to the new weights" : "DIFFERS from the new weights",
                service.size());
    ok = summary.committed && exact && service.size() == 0;
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
