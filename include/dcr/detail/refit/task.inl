// dcr/detail/refit/task.inl: the bodies of dcr/refit/task.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE void validate_task(const affine_task& task, const tensor_registry& registry) {
  std::visit(
      [&](const auto& m) {
        DCR_EXPECTS(task.targets.size() == m.parts(), errc::invalid_argument,
                    "affine task '" + task.shard_name + "': " + std::to_string(m.parts()) +
                        " mapping parts but " + std::to_string(task.targets.size()) + " targets");
        for (std::uint32_t p = 0; p < m.parts(); ++p) {
          const auto& t = registry.at(task.targets[p]);
          DCR_EXPECTS(t.type == task.type, errc::dtype_mismatch,
                      "affine task '" + task.shard_name + "': target '" + t.name + "' has dtype " +
                          std::string(dtype_name(t.type)) + ", shard has " +
                          std::string(dtype_name(task.type)));
          DCR_EXPECTS(static_cast<std::uint64_t>(t.numel()) == m.part_size(p), errc::shape_mismatch,
                      "affine task '" + task.shard_name + "': mapping expects " +
                          std::to_string(m.part_size(p)) + " elements in '" + t.name +
                          "', it has " + std::to_string(t.numel()));
        }
      },
      task.mapping);
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
