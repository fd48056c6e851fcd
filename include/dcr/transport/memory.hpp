// dcr/transport/memory.hpp: an in-process transport with object-storage semantics, for tests
// and `dcr simulate`. Thread-safe. Payloads and manifests live in memory until erased.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/error.hpp"
#include "dcr/transport/concept.hpp"

namespace dcr {

class memory_transport {
 public:
  using transport_concept = transport_tag;

  /// Stores a payload under its id. Publishing the same id again with other bytes is an error
  /// (a payload id names one immutable object).
  void publish(const payload_id& id, std::span<const std::byte> bytes) {
    std::lock_guard lock(mutex_);
    auto [it, inserted] = objects_.try_emplace(id, bytes.begin(), bytes.end());
    DCR_EXPECTS(inserted || std::equal(bytes.begin(), bytes.end(), it->second.begin(),
                                       it->second.end()),
                errc::transport_failure,
                "memory_transport: payload id republished with different bytes");
    bytes_published_ += inserted ? bytes.size() : 0;
  }

  /// Records that `owner` published exactly `ids` for attempt `key`.
  void publish_manifest(const attempt_key& key, std::uint32_t owner,
                        std::span<const payload_id> ids) {
    std::lock_guard lock(mutex_);
    for (const auto& id : ids)
      DCR_EXPECTS(objects_.contains(id) && attempt_of(id) == key, errc::transport_failure,
                  "memory_transport: manifest lists a payload that was not published");
    manifests_[key][owner] = std::vector<payload_id>(ids.begin(), ids.end());
  }

  /// Every payload id listed for the attempt, ordered by (owner, sequence).
  std::vector<payload_id> manifest(const attempt_key& key) const {
    std::lock_guard lock(mutex_);
    std::vector<payload_id> all;
    if (auto it = manifests_.find(key); it != manifests_.end())
      for (const auto& [owner, ids] : it->second) all.insert(all.end(), ids.begin(), ids.end());
    return all;
  }

  /// How many owners have published their manifest for the attempt.
  std::uint32_t owners_listed(const attempt_key& key) const {
    std::lock_guard lock(mutex_);
    auto it = manifests_.find(key);
    return it == manifests_.end() ? 0u : static_cast<std::uint32_t>(it->second.size());
  }

  /// Copies the payload into `out`; throws transport_failure if it is not stored.
  void fetch(const payload_id& id, std::vector<std::byte>& out) const {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(id);
    DCR_EXPECTS(it != objects_.end(), errc::transport_failure,
                "memory_transport: no payload (owner " + std::to_string(id.owner) + ", sequence " +
                    std::to_string(id.sequence) + ", attempt " + std::to_string(id.attempt) + ")");
    out.assign(it->second.begin(), it->second.end());
  }

  /// Drops every payload and manifest of transitions whose target version is <= `version`
  /// (transitions that ended with or before that commit).
  void erase_before(std::uint64_t version) {
    std::lock_guard lock(mutex_);
    std::erase_if(objects_, [&](const auto& kv) { return kv.first.target_version <= version; });
    std::erase_if(manifests_, [&](const auto& kv) { return kv.first.target_version <= version; });
  }

  /// Unique payload bytes published since construction.
  std::uint64_t bytes_published() const {
    std::lock_guard lock(mutex_);
    return bytes_published_;
  }

  /// Test hook: mutable access to a stored payload (to corrupt it in place).
  std::vector<std::byte>* object_for_testing(const payload_id& id) {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : &it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<payload_id, std::vector<std::byte>> objects_;
  std::map<attempt_key, std::map<std::uint32_t, std::vector<payload_id>>> manifests_;
  std::uint64_t bytes_published_ = 0;
};

static_assert(transport<memory_transport>);

}  // namespace dcr
