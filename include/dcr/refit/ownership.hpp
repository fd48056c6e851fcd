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
inline std::vector<std::uint32_t> assign_owners(std::span<const shard_holding> shards) {
  std::vector<std::size_t> order(shards.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<std::uint64_t> hash(shards.size());
  std::uint32_t max_rank = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    DCR_EXPECTS(!shards[i].holders.empty(), errc::invalid_argument,
                "assign_owners: shard '" + shards[i].name + "' has no holder");
    hash[i] = stable_name_hash(shards[i].name);
    for (auto r : shards[i].holders) max_rank = std::max(max_rank, r);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (shards[a].bytes != shards[b].bytes) return shards[a].bytes > shards[b].bytes;
    if (hash[a] != hash[b]) return hash[a] < hash[b];
    return shards[a].name < shards[b].name;
  });
  for (std::size_t k = 1; k < order.size(); ++k)
    DCR_EXPECTS(shards[order[k]].name != shards[order[k - 1]].name, errc::invalid_argument,
                "assign_owners: duplicate shard name '" + shards[order[k]].name + "'");
  std::vector<std::uint64_t> load(std::size_t{max_rank} + 1, 0);
  std::vector<std::uint32_t> owner(shards.size(), 0);
  for (std::size_t i : order) {
    // Holders sorted so the choice does not depend on the order the caller listed them in.
    std::vector<std::uint32_t> holders = shards[i].holders;
    std::sort(holders.begin(), holders.end());
    const std::size_t n = holders.size();
    const std::size_t start = hash[i] % n;
    std::uint32_t best = holders[start];
    for (std::size_t k = 1; k < n; ++k) {
      const std::uint32_t r = holders[(start + k) % n];
      if (load[r] < load[best]) best = r;
    }
    owner[i] = best;
    load[best] += shards[i].bytes;
  }
  return owner;
}

/// The owner of residual task `task_name` among the ranks `eligible` to own it (those that see,
/// or can gather, every input; any order, duplicates ignored, non-empty): the
/// (stable_name_hash(task_name) % n)-th of the distinct eligible ranks in increasing order. Every
/// rank computes the same answer from the name alone, and it stays fixed while the eligible set
/// does.
inline std::uint32_t residual_owner(std::string_view task_name,
                                    std::span<const std::uint32_t> eligible) {
  DCR_EXPECTS(!eligible.empty(), errc::invalid_argument,
              "residual_owner: residual task '" + std::string(task_name) +
                  "' has no eligible owner");
  std::vector<std::uint32_t> ranks(eligible.begin(), eligible.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks[stable_name_hash(task_name) % ranks.size()];
}

/// A residual task as ownership sees it.
struct residual_holding {
  std::string name;                     ///< the residual task's name, unique across the model
  std::vector<std::uint32_t> eligible;  ///< ranks that can own it (non-empty)
};

/// residual_owner for each task; result[i] is the owner rank of tasks[i]. Throws on duplicate
/// task names (two tasks would be told apart only by their order).
inline std::vector<std::uint32_t> assign_residual_owners(std::span<const residual_holding> tasks) {
  std::vector<std::string_view> names;
  names.reserve(tasks.size());
  for (const auto& t : tasks) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  const auto dup = std::adjacent_find(names.begin(), names.end());
  DCR_EXPECTS(dup == names.end(), errc::invalid_argument,
              "assign_residual_owners: duplicate residual task name '" +
                  (dup == names.end() ? std::string() : std::string(*dup)) + "'");
  std::vector<std::uint32_t> owner(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i)
    owner[i] = residual_owner(tasks[i].name, tasks[i].eligible);
  return owner;
}

}  // namespace dcr
