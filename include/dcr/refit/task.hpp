// dcr/refit/task.hpp: affine conversion tasks, the owner-side description of a source shard.
//
// An affine task says how one source shard (a training rank's words) lies in canonical
// coordinates: its mapping class sends local index j to (part, index), and part p names the
// canonical tensor targets[p]. Affine tasks copy words unchanged, so their records may use xor
// (or ulp) encodings whenever the receivers' loader paths preserve bits for the targets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/error.hpp"
#include "dcr/mapping.hpp"

namespace dcr {

struct affine_task {
  std::string shard_name;         ///< unique name of the source shard (ownership hashes it)
  dtype type = dtype::bf16;       ///< element type of the shard and of every target
  any_mapping mapping;            ///< local index -> (part, canonical index)
  std::vector<tensor_id> targets; ///< part p -> canonical tensor targets[p]
  /// Whether receivers may apply xor/ulp records of this task (the projection and every
  /// receiver's loader path preserve stored bits and no other write overlaps). False forces
  /// overwrite records, which are always exact.
  bool delta_encodable = true;

  /// Words in the source shard.
  [[nodiscard]] std::uint64_t local_size() const { return dcr::local_size(mapping); }
  /// Bytes in the source shard.
  [[nodiscard]] std::uint64_t bytes() const { return local_size() * dtype_size(type); }
};

/// Checks a task against the registry: one target per part, every target known, of the task's
/// dtype, and of the element count the mapping expects. Throws dcr::error naming the shard.
void validate_task(const affine_task& task, const tensor_registry& registry);

}  // namespace dcr

#include "dcr/detail/refit/task.inl"
