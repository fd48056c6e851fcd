// dcr/protocol/control_plane.hpp: what a control plane provides (the etcd v3 model), and the
// small helpers every agent uses on top of it.
//
// The coordinator, the owner agents and the receiver agents share no memory. Everything they
// agree on is a record in a control plane or an object in a payload store
// (dcr/protocol/payload_store.hpp). A control plane is a key-value store with:
//   - revisions: every successful write advances the store's revision by one; each key carries
//     the revision of its last write (etcd's mod_revision), 0 meaning "absent";
//   - transactions: a set of compares on key revisions and a set of writes, applied atomically
//     if and only if every compare holds (etcd's txn; the joint commit compares the commit
//     record and the attempt record in one step);
//   - waiting for a change under a key prefix with a deadline (etcd's watch; a store that cannot
//     watch polls);
//   - leases: a record written under a lease disappears when the lease expires (registrations
//     of live receivers).
// Implementations: memory_control_plane (tests, one process), file_control_plane (a directory
// on a local or shared filesystem, the embedded default), etcd_control_plane (etcd v3 through
// its JSON gateway). A control plane that cannot be reached throws
// errc::control_plane_unavailable naming itself and the operation; callers retry until their
// own deadline (protocol operations never give up silently).
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dcr {

/// Opt-in tag: a control plane declares `using control_plane_concept = dcr::control_plane_tag;`.
struct control_plane_tag {};

/// A lease id; 0 means "no lease".
using lease_id = std::int64_t;

/// The clock every protocol deadline uses (within one process).
using protocol_clock = std::chrono::steady_clock;

/// One stored record.
struct control_record {
  std::string key;
  std::string value;
  std::int64_t revision = 0;  ///< store revision of the record's last write (> 0)
  lease_id lease = 0;         ///< lease the record is attached to, 0 if none
};

/// A transaction precondition: `key` was last written at `revision` (0: `key` is absent).
struct key_compare {
  std::string key;
  std::int64_t revision = 0;
};

/// A transaction write: put `value` under `key` (attached to `lease` when not 0), or erase it.
struct key_write {
  std::string key;
  std::string value;
  lease_id lease = 0;
  bool erase = false;
};

template <class C>
concept control_plane =
    std::derived_from<typename C::control_plane_concept, control_plane_tag> &&
    requires(C& c, const std::string& key, std::span<const key_compare> compares,
             std::span<const key_write> writes, std::int64_t revision,
             protocol_clock::time_point deadline, std::chrono::seconds ttl, lease_id lease) {
      // The record under `key`, if present (and, for a leased record, its lease not expired).
      { c.get(key) } -> std::same_as<std::optional<control_record>>;
      // Every present record whose key starts with `key` (a prefix), sorted by key.
      { c.list(key) } -> std::same_as<std::vector<control_record>>;
      // If every compare holds, applies every write atomically and returns true; otherwise
      // writes nothing and returns false. Never leaves a torn or partial record.
      { c.transact(compares, writes) } -> std::same_as<bool>;
      // The store's current revision (the last write's).
      { c.revision() } -> std::same_as<std::int64_t>;
      // Blocks until some record under the prefix `key` changed (written, erased or its lease
      // expired) after store revision `revision`, or until `deadline`; returns the store
      // revision it observed. May return early (a spurious wake-up): callers re-read.
      { c.wait_for_change(key, revision, deadline) } -> std::same_as<std::int64_t>;
      // A new lease of `ttl`; records attached to it vanish once it is not kept alive.
      { c.grant_lease(ttl) } -> std::same_as<lease_id>;
      // Renews the lease; false if it already expired (its records are gone).
      { c.keep_alive(lease) } -> std::same_as<bool>;
      // Ends the lease now, erasing its records.
      c.revoke(lease);
    };

/// Writes `value` under `key` only if the key is at `expected_revision` (0: absent). Returns
/// whether it did.
template <control_plane C>
bool put_if(C& plane, const std::string& key, std::string value, std::int64_t expected_revision,
            lease_id lease = 0) {
  const key_compare cmp{key, expected_revision};
  const key_write w{key, std::move(value), lease, false};
  return plane.transact(std::span<const key_compare>(&cmp, 1), std::span<const key_write>(&w, 1));
}

/// Writes `value` under `key` unconditionally (a record only one writer ever writes: an
/// acknowledgement, an owner's report, a registration).
template <control_plane C>
void put(C& plane, const std::string& key, std::string value, lease_id lease = 0) {
  const key_write w{key, std::move(value), lease, false};
  plane.transact(std::span<const key_compare>{}, std::span<const key_write>(&w, 1));
}

/// Erases `key` unconditionally (absent is fine).
template <control_plane C>
void erase(C& plane, const std::string& key) {
  const key_write w{key, {}, 0, true};
  plane.transact(std::span<const key_compare>{}, std::span<const key_write>(&w, 1));
}

}  // namespace dcr
