// dcr/commit/concept.hpp: the joint commit record and what a commit store provides.
//
// The commit record binds a policy version to its source baseline. It changes only by
// compare-and-set: a coordinator commits version v+1 only if the record still says v, so two
// coordinators (or a coordinator and its failover) can never both publish a version.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>

namespace dcr {

/// Opt-in tag: a commit store declares `using commit_store_concept = dcr::commit_store_tag;`.
struct commit_store_tag {};

/// The durable record of the committed policy version.
struct commit_record {
  std::uint64_t version = 0;               ///< committed policy version
  std::uint32_t attempt = 0;               ///< attempt of the transition that produced it
  std::uint64_t registry_fingerprint = 0;  ///< model the version belongs to
  std::uint64_t epoch = 0;                 ///< incremented by every successful compare-and-set
  friend constexpr bool operator==(const commit_record&, const commit_record&) = default;
};

template <class S>
concept commit_store =
    std::same_as<typename S::commit_store_concept, commit_store_tag> &&
    requires(S& s, const std::optional<commit_record>& expected, const commit_record& desired) {
      { s.read() } -> std::same_as<std::optional<commit_record>>;
      // Replaces the record with `desired` only if it currently equals `expected` (nullopt: no
      // record yet). Returns whether it did. Never partially writes.
      { s.compare_and_set(expected, desired) } -> std::same_as<bool>;
    };

}  // namespace dcr
