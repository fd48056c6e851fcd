// python/src/owner.hpp: the Python Owner (dcr::owner plus what the binding needs to check the
// shards it is handed), shared by owner.cpp and protocol.cpp (the owner agent drives it).
#pragma once

#include <memory>

#include "common.hpp"
#include "dcr/refit/owner.hpp"

namespace dcr_py {

/// dcr::encoding_policy from its name.
inline dcr::encoding_policy policy_from_name(const std::string& s) {
  if (s == "mixed") return dcr::encoding_policy::mixed;
  if (s == "overwrite") return dcr::encoding_policy::overwrite_only;
  if (s == "xor") return dcr::encoding_policy::xor_only;
  if (s == "ulp") return dcr::encoding_policy::ulp_only;
  throw dcr::error(dcr::errc::invalid_argument,
                   "encoding policy '" + s + "': expected mixed, overwrite, xor or ulp");
}

class py_owner {
 public:
  py_owner(const dcr::tensor_registry& registry, std::uint32_t id,
           std::vector<dcr::affine_task> tasks, std::vector<dcr::residual_task> residual)
      : registry_(&registry) {
    for (const auto& t : tasks) {
      names_.push_back(t.shard_name);
      types_.push_back(t.type);
      elements_.push_back(t.local_size());
    }
    for (const auto& r : residual)
      for (const auto& in : r.inputs) {
        input_names_.push_back(r.name + "/" + in.name);
        input_types_.push_back(in.type);
        input_elements_.push_back(in.elements);
      }
    owner_ = std::make_unique<dcr::owner>(registry, id, std::move(tasks), std::move(residual));
  }

  /// Spans of the shards (tasks()[i]) and residual inputs, checked and named. GIL held.
  void spans(const std::vector<tensor_arg>& shards, const std::vector<tensor_arg>& inputs,
             std::vector<std::span<const std::byte>>& s, std::vector<std::span<const std::byte>>& in,
             const std::string& what) const {
    s = tensor_spans(shards, types_, elements_, names_, what);
    in = tensor_spans(inputs, input_types_, input_elements_, input_names_, what + " (residual inputs)");
  }

  dcr::owner& get() { return *owner_; }
  const dcr::tensor_registry& registry() const { return *registry_; }
  const std::vector<std::string>& shard_names() const { return names_; }

 private:
  const dcr::tensor_registry* registry_;
  std::unique_ptr<dcr::owner> owner_;
  std::vector<std::string> names_, input_names_;
  std::vector<dcr::dtype> types_, input_types_;
  std::vector<std::uint64_t> elements_, input_elements_;
};

}  // namespace dcr_py
