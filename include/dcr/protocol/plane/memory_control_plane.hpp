// dcr/protocol/plane/memory_control_plane.hpp: a control plane in one process's memory (tests, the
// in-process driver). Thread-safe; waiting uses a condition variable; leases expire on the
// steady clock. Nothing survives the process.
#pragma once
#include "dcr/config.hpp"
#include <condition_variable>
#include <map>
#include <mutex>

#include "dcr/error.hpp"
#include "dcr/protocol/control_plane.hpp"

namespace dcr {

class memory_control_plane {
 public:
  using control_plane_concept = control_plane_tag;

  std::optional<control_record> get(const std::string& key);

  std::vector<control_record> list(const std::string& prefix);

  bool transact(std::span<const key_compare> compares, std::span<const key_write> writes);

  std::int64_t revision();

  std::int64_t wait_for_change(const std::string& prefix, std::int64_t after,
                               protocol_clock::time_point deadline);

  lease_id grant_lease(std::chrono::seconds ttl);

  bool keep_alive(lease_id lease);

  void revoke(lease_id lease);

 private:
  // Records change when written (revision > after) or erased since `after`; an erase is
  // remembered as a tombstone revision per prefix-free key in `erased_`.
  bool changed_under(const std::string& prefix, std::int64_t after) const;

  void expire_leases();

  void drop_lease_records(lease_id lease);

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

#include "dcr/detail/protocol/plane/memory_control_plane.inl"
