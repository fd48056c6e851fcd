// dcr/refit/ownership.hpp: which training rank compares each unique source shard.
//
// Data-parallel replicas (and, for replicated tensors such as norms, tensor-parallel ranks too)
// hold bitwise-identical copies of a shard, so exactly one holder, the owner, compares it with
// its tracker and emits its records. The assignment depends only on shard names, sizes and
// holders, so every rank computes the same plan without talking to the others, and it stays
// fixed across the attempts of a transition (a retry re-sends exactly the failed attempt's set).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
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

}  // namespace dcr
