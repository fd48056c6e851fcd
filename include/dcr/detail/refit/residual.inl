// dcr/detail/refit/residual.inl: the bodies of dcr/refit/residual.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE void validate_residual_task(const residual_task& task, const tensor_registry& registry) {
  const std::string where = "residual task '" + task.name + "'";
  DCR_EXPECTS(!task.name.empty(), errc::invalid_argument, "residual task with an empty name");
  DCR_EXPECTS(static_cast<bool>(task.convert), errc::invalid_argument,
              where + ": no conversion callable");
  DCR_EXPECTS(!task.inputs.empty(), errc::invalid_argument, where + ": no inputs");
  DCR_EXPECTS(!task.outputs.empty(), errc::invalid_argument, where + ": no outputs");
  for (std::size_t k = 0; k < task.inputs.size(); ++k) {
    const auto& in = task.inputs[k];
    DCR_EXPECTS(in.elements > 0, errc::invalid_argument,
                where + ": input '" + in.name + "' has no elements");
    DCR_EXPECTS(dtype_size(in.type) != 0, errc::invalid_argument,
                where + ": input '" + in.name + "' has an unknown dtype");
    for (std::size_t j = 0; j < k; ++j)
      DCR_EXPECTS(task.inputs[j].name != in.name, errc::invalid_argument,
                  where + ": input name '" + in.name + "' used twice");
  }
  for (std::size_t o = 0; o < task.outputs.size(); ++o) {
    const auto& out = task.outputs[o];
    DCR_EXPECTS(out.tensor < registry.size(), errc::unknown_tensor,
                where + ": output " + std::to_string(o) + " names tensor id " +
                    std::to_string(out.tensor) + ", the registry has " +
                    std::to_string(registry.size()) + " tensors");
    for (std::size_t j = 0; j < o; ++j)
      DCR_EXPECTS(task.outputs[j].tensor != out.tensor, errc::invalid_argument,
                  where + ": output '" + registry.at(out.tensor).name + "' listed twice");
    for (auto k : out.depends_on)
      DCR_EXPECTS(k < task.inputs.size(), errc::invalid_argument,
                  where + ": output '" + registry.at(out.tensor).name + "' depends on input " +
                      std::to_string(k) + ", the task has " + std::to_string(task.inputs.size()) +
                      " inputs");
  }
}

DCR_INLINE void validate_task_set(const tensor_registry& registry,
                                  std::span<const affine_task> affine,
                                  std::span<const residual_task> residual) {
  for (const auto& t : affine) validate_task(t, registry);
  std::unordered_map<tensor_id, std::size_t> residual_producer;
  std::unordered_map<std::string, std::size_t> names;
  for (std::size_t r = 0; r < residual.size(); ++r) {
    const auto& task = residual[r];
    validate_residual_task(task, registry);
    auto [n, fresh] = names.emplace(task.name, r);
    DCR_EXPECTS(fresh, errc::invalid_argument,
                "residual task name '" + task.name + "' used by two tasks");
    for (const auto& out : task.outputs) {
      auto [it, inserted] = residual_producer.emplace(out.tensor, r);
      DCR_EXPECTS(inserted, errc::invalid_argument,
                  "canonical tensor '" + registry.at(out.tensor).name +
                      "' is produced by two residual tasks, '" + residual[it->second].name +
                      "' and '" + task.name + "'");
    }
  }
  for (const auto& t : affine)
    for (auto target : t.targets) {
      auto it = residual_producer.find(target);
      DCR_EXPECTS(it == residual_producer.end(), errc::invalid_argument,
                  "canonical tensor '" + registry.at(target).name +
                      "' is produced by residual task '" + residual[it->second].name +
                      "' and by affine task '" + t.shard_name + "'");
    }
}

DCR_INLINE task_coverage measure_coverage(const tensor_registry& registry,
                                          std::span<const affine_task> affine,
                                          std::span<const residual_task> residual) {
  validate_task_set(registry, affine, residual);
  enum : std::uint8_t { none, by_affine, by_residual };
  std::vector<std::uint8_t> kind(registry.size(), none);
  for (const auto& t : affine)
    for (auto target : t.targets) kind[target] = by_affine;
  for (const auto& t : residual)
    for (const auto& out : t.outputs) kind[out.tensor] = by_residual;
  task_coverage c;
  for (std::size_t id = 0; id < registry.size(); ++id) {
    const auto b = static_cast<std::uint64_t>(registry.at(static_cast<tensor_id>(id)).bytes());
    c.checkpoint_bytes += b;
    (kind[id] == by_affine     ? c.affine_bytes
     : kind[id] == by_residual ? c.residual_bytes
                               : c.uncovered_bytes) += b;
  }
  return c;
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
