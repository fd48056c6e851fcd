// dcr/sim/rank_owner.hpp: the dcr::owner of one trainer rank of a synthetic_trainer (its affine
// shards and the residual tasks it owns), and the candidate spans of the trainer's current step
// in the order the owner expects. Used by `dcr simulate`'s owner processes and the owner
// benchmark, so both build the owner the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dcr/refit/owner.hpp"
#include "dcr/sim/moe_model.hpp"

namespace dcr::sim {

struct rank_owner {
  std::unique_ptr<dcr::owner> owner;
  std::vector<std::size_t> shard_index;     ///< owner task i is trainer shard shard_index[i]
  std::vector<std::size_t> residual_index;  ///< owner residual task r is trainer residual[r]

  /// The trainer's current words for the owner's tasks (`candidates`) and residual inputs
  /// (`inputs`, flattened in task order), as owner::build_items takes them.
  void spans(const synthetic_trainer& trainer, std::vector<std::span<const std::byte>>& candidates,
             std::vector<std::span<const std::byte>>& inputs) const {
    candidates.clear();
    inputs.clear();
    for (auto i : shard_index) candidates.push_back(trainer.words(i));
    for (auto r : residual_index)
      for (std::size_t k = 0; k < trainer.residual()[r].task.inputs.size(); ++k)
        inputs.push_back(trainer.residual_words(r, k));
  }
};

/// The owner of trainer rank `rank`: every shard and residual task the trainer assigns to it.
inline rank_owner make_rank_owner(const tensor_registry& registry,
                                  const synthetic_trainer& trainer, std::uint32_t rank) {
  rank_owner out;
  std::vector<affine_task> tasks;
  std::vector<residual_task> residual;
  const auto owners = trainer.owners();
  const auto residual_owners = trainer.residual_owners();
  for (std::size_t i = 0; i < owners.size(); ++i)
    if (owners[i] == rank) {
      tasks.push_back(trainer.shards()[i].task);
      out.shard_index.push_back(i);
    }
  for (std::size_t r = 0; r < residual_owners.size(); ++r)
    if (residual_owners[r] == rank) {
      residual.push_back(trainer.residual()[r].task);
      out.residual_index.push_back(r);
    }
  out.owner = std::make_unique<dcr::owner>(registry, rank, std::move(tasks), std::move(residual));
  return out;
}

}  // namespace dcr::sim
