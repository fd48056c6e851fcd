// dcr/commit/concept.hpp: the joint commit record and what a commit store provides.
//
// The commit record binds a policy version to its source baseline. It changes only by
// compare-and-set: a coordinator commits version v+1 only if the record still says v, so two
// coordinators (or a coordinator and its failover) can never both publish a version.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>

#include "dcr/protocol/records.hpp"

namespace dcr {

/// Opt-in tag: a commit store declares `using commit_store_concept = dcr::commit_store_tag;`.
struct commit_store_tag {};

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
