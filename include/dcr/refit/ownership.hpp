// dcr/refit/ownership.hpp: which training rank compares each unique source shard.
//
// Data-parallel replicas (and, for replicated tensors such as norms, tensor-parallel ranks too)
// hold bitwise-identical copies of a shard, so exactly one holder, the owner, compares it with
// its tracker and emits its records. The assignment depends only on shard names, sizes and
// holders, so every rank computes the same plan without talking to the others, and it stays
// fixed across the attempts of a transition (a retry re-sends exactly the failed attempt's set).
//
// Residual tasks (dcr/refit/residual.hpp) are owned differently: their canonical tensors must be
// built from every input, so the owner is picked by the stable hash of the task's name among the
// ranks that can see all its inputs (residual_owner). In one process every owner sees every
// shard; a distributed deployment gathers the task's inputs to that owner before conversion
// (the same gather a dense refit does for those tensors), and only that rank keeps the task's
// input copies and residual baseline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// A unique source shard as ownership sees it.
struct shard_holding {
  std::string name;                    ///< unique across the model
  std::uint64_t bytes = 0;             ///< bytes the owner compares
  std::vector<std::uint32_t> holders;  ///< ranks holding an identical copy (non-empty)
};

/// Picks one owner rank per shard among its holders, balancing compared bytes over ranks.
///
/// Largest shards first (ties broken by stable name hash, then name) go to their least-loaded
/// holder; among equally loaded holders the scan starts at `hash % holders`, so many small
/// equal shards (norms) spread out instead of piling on the first holder. Result[i] is the
/// owner rank of shards[i]. Deterministic for the same set of shards, whatever their order.
std::vector<std::uint32_t> assign_owners(std::span<const shard_holding> shards);

/// The owner of residual task `task_name` among the ranks `eligible` to own it (those that see,
/// or can gather, every input; any order, duplicates ignored, non-empty): the
/// (stable_name_hash(task_name) % n)-th of the distinct eligible ranks in increasing order. Every
/// rank computes the same answer from the name alone, and it stays fixed while the eligible set
/// does.
std::uint32_t residual_owner(std::string_view task_name,
                             std::span<const std::uint32_t> eligible);

/// A residual task as ownership sees it.
struct residual_holding {
  std::string name;                     ///< the residual task's name, unique across the model
  std::vector<std::uint32_t> eligible;  ///< ranks that can own it (non-empty)
};

/// residual_owner for each task; result[i] is the owner rank of tasks[i]. Throws on duplicate
/// task names (two tasks would be told apart only by their order).
std::vector<std::uint32_t> assign_residual_owners(std::span<const residual_holding> tasks);

}  // namespace dcr

#include "dcr/detail/refit/ownership.inl"
