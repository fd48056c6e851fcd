// dcr/protocol/memory_control_plane.hpp: a control plane in one process's memory (tests, the
// in-process driver). Thread-safe; waiting uses a condition variable; leases expire on the
// steady clock. Nothing survives the process.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "dcr/error.hpp"
#include "dcr/protocol/control_plane.hpp"

namespace dcr {

class memory_control_plane {
 public:
  using control_plane_concept = control_plane_tag;

  std::optional<control_record> get(const std::string& key) {
    std::lock_guard lock(mutex_);
    expire_leases();
    auto it = records_.find(key);
    if (it == records_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<control_record> list(const std::string& prefix) {
    std::lock_guard lock(mutex_);
    expire_leases();
    std::vector<control_record> out;
    for (auto it = records_.lower_bound(prefix);
         it != records_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      out.push_back(it->second);
    return out;
  }

  bool transact(std::span<const key_compare> compares, std::span<const key_write> writes) {
    std::lock_guard lock(mutex_);
    expire_leases();
    for (const auto& c : compares) {
      auto it = records_.find(c.key);
      const std::int64_t at = it == records_.end() ? 0 : it->second.revision;
      if (at != c.revision) return false;
    }
    for (const auto& w : writes)
      DCR_EXPECTS(w.erase || w.lease == 0 || leases_.contains(w.lease), errc::invalid_argument,
                  "memory_control_plane: write of '" + w.key + "' under unknown lease " +
                      std::to_string(w.lease));
    if (writes.empty()) return true;
    ++revision_;
    for (const auto& w : writes) {
      if (w.erase) {
        if (records_.erase(w.key) != 0) erased_[w.key] = revision_;
      } else {
        records_[w.key] = control_record{w.key, w.value, revision_, w.lease};
      }
    }
    changed_.notify_all();
    return true;
  }

  std::int64_t revision() {
    std::lock_guard lock(mutex_);
    expire_leases();
    return revision_;
  }

  std::int64_t wait_for_change(const std::string& prefix, std::int64_t after,
                               protocol_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    for (;;) {
      expire_leases();
      if (changed_under(prefix, after)) return revision_;
      // Wake at the deadline or the next lease expiry, whichever is first.
      auto wake = deadline;
      for (const auto& [id, expiry] : leases_) wake = std::min(wake, expiry);
      if (protocol_clock::now() >= deadline) return revision_;
      changed_.wait_until(lock, wake);
    }
  }

  lease_id grant_lease(std::chrono::seconds ttl) {
    std::lock_guard lock(mutex_);
    const lease_id id = ++next_lease_;
    leases_[id] = protocol_clock::now() + ttl;
    ttl_[id] = ttl;
    return id;
  }

  bool keep_alive(lease_id lease) {
    std::lock_guard lock(mutex_);
    expire_leases();
    auto it = leases_.find(lease);
    if (it == leases_.end()) return false;
    it->second = protocol_clock::now() + ttl_[lease];
    return true;
  }

  void revoke(lease_id lease) {
    std::lock_guard lock(mutex_);
    if (leases_.erase(lease) != 0) drop_lease_records(lease);
  }

 private:
  // Records change when written (revision > after) or erased since `after`; an erase is
  // remembered as a tombstone revision per prefix-free key in `erased_`.
  bool changed_under(const std::string& prefix, std::int64_t after) const {
    for (auto it = records_.lower_bound(prefix);
         it != records_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      if (it->second.revision > after) return true;
    for (auto it = erased_.lower_bound(prefix);
         it != erased_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      if (it->second > after) return true;
    return false;
  }

  void expire_leases() {
    const auto now = protocol_clock::now();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second <= now) {
        const lease_id id = it->first;
        it = leases_.erase(it);
        drop_lease_records(id);
      } else {
        ++it;
      }
    }
  }

  void drop_lease_records(lease_id lease) {
    bool any = false;
    for (auto it = records_.begin(); it != records_.end();) {
      if (it->second.lease == lease) {
        if (!any) ++revision_;
        any = true;
        erased_[it->first] = revision_;
        it = records_.erase(it);
      } else {
        ++it;
      }
    }
    if (any) changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, control_record> records_;
  std::map<std::string, std::int64_t> erased_;  // key -> revision of its last erase
  std::map<lease_id, protocol_clock::time_point> leases_;
  std::map<lease_id, std::chrono::seconds> ttl_;
  std::int64_t revision_ = 0;
  lease_id next_lease_ = 0;
};

static_assert(control_plane<memory_control_plane>);

}  // namespace dcr
