// dcr/detail/protocol/plane/memory_control_plane.inl: the bodies of dcr/protocol/plane/memory_control_plane.hpp
// (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace dcr {

DCR_INLINE std::optional<control_record> memory_control_plane::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  expire_leases();
  auto it = records_.find(key);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

DCR_INLINE std::vector<control_record> memory_control_plane::list(const std::string& prefix) {
  std::lock_guard lock(mutex_);
  expire_leases();
  std::vector<control_record> out;
  for (auto it = records_.lower_bound(prefix);
       it != records_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->second);
  return out;
}

DCR_INLINE bool memory_control_plane::transact(std::span<const key_compare> compares,
                                               std::span<const key_write> writes) {
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

DCR_INLINE std::int64_t memory_control_plane::revision() {
  std::lock_guard lock(mutex_);
  expire_leases();
  return revision_;
}

DCR_INLINE std::int64_t memory_control_plane::wait_for_change(const std::string& prefix,
                                                              std::int64_t after,
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

DCR_INLINE lease_id memory_control_plane::grant_lease(std::chrono::seconds ttl) {
  std::lock_guard lock(mutex_);
  const lease_id id = ++next_lease_;
  leases_[id] = protocol_clock::now() + ttl;
  ttl_[id] = ttl;
  return id;
}

DCR_INLINE bool memory_control_plane::keep_alive(lease_id lease) {
  std::lock_guard lock(mutex_);
  expire_leases();
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  it->second = protocol_clock::now() + ttl_[lease];
  return true;
}

DCR_INLINE void memory_control_plane::revoke(lease_id lease) {
  std::lock_guard lock(mutex_);
  if (leases_.erase(lease) != 0) drop_lease_records(lease);
}

DCR_INLINE bool memory_control_plane::changed_under(const std::string& prefix,
                                                    std::int64_t after) const {
  for (auto it = records_.lower_bound(prefix);
       it != records_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    if (it->second.revision > after) return true;
  for (auto it = erased_.lower_bound(prefix);
       it != erased_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    if (it->second > after) return true;
  return false;
}

DCR_INLINE void memory_control_plane::expire_leases() {
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

DCR_INLINE void memory_control_plane::drop_lease_records(lease_id lease) {
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

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
