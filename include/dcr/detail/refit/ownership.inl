// dcr/detail/refit/ownership.inl: the bodies of dcr/refit/ownership.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE std::vector<std::uint32_t> assign_owners(std::span<const shard_holding> shards) {
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

DCR_INLINE std::uint32_t residual_owner(std::string_view task_name,
                                        std::span<const std::uint32_t> eligible) {
  DCR_EXPECTS(
      !eligible.empty(), errc::invalid_argument,
      "residual_owner: residual task '" + std::string(task_name) + "' has no eligible owner");
  std::vector<std::uint32_t> ranks(eligible.begin(), eligible.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks[stable_name_hash(task_name) % ranks.size()];
}

DCR_INLINE std::vector<std::uint32_t> assign_residual_owners(
    std::span<const residual_holding> tasks) {
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

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
