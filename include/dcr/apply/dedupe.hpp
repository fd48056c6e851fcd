// dcr/apply/dedupe.hpp: which payloads a receiver has applied in the current transition.
//
// xor records are not idempotent: applying a mask twice restores the old bits. Transports may
// deliver a payload more than once (retries, relay fan-out, a re-listed manifest), so a receiver
// applies each payload id at most once per transition. Overwrite-only retries carry a new
// attempt id, so they are distinct payloads and are applied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "dcr/codec/item.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// The set of payload ids applied in the current transition (base -> target).
///
/// Usage per payload: `if (!ledger.seen(id)) { apply(...); ledger.mark(id); }`; mark only after
/// the apply succeeded, so a payload whose apply threw can be delivered again. Whether an id
/// belongs to the current transition is the caller's check (it answers stale_payload); the
/// ledger only remembers.
class payload_ledger {
 public:
  /// Starts a new transition: forgets every id.
  void reset_for(std::uint64_t base_version, std::uint64_t target_version);

  /// Whether `id` was marked since the last reset_for().
  [[nodiscard]] bool seen(const payload_id& id) const { return applied_.count(id) != 0; }

  /// Remembers `id` as applied. Throws errc::duplicate_payload if it already was: marking twice
  /// means the caller applied the payload twice, which corrupts xor records.
  void mark(const payload_id& id);

  /// Number of ids marked in the current transition.
  [[nodiscard]] std::size_t size() const noexcept { return applied_.size(); }
  /// The transition set by the last reset_for() (0 -> 0 before the first).
  [[nodiscard]] std::uint64_t base_version() const noexcept { return base_; }
  [[nodiscard]] std::uint64_t target_version() const noexcept { return target_; }

 private:
  std::set<payload_id> applied_;
  std::uint64_t base_ = 0;
  std::uint64_t target_ = 0;
};

}  // namespace dcr

#include "dcr/detail/apply/dedupe.inl"
