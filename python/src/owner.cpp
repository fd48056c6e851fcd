// python/src/owner.cpp: the Owner (detect, project or convert, encode, pack; commit).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "owner.hpp"

namespace dcr_py {
namespace {

dcr::build_mode mode_from_name(const std::string& s) {
  if (s == "changes") return dcr::build_mode::changes;
  if (s == "dense") return dcr::build_mode::dense;
  throw dcr::error(dcr::errc::invalid_argument, "build mode '" + s + "': expected changes or dense");
}

nb::dict stats_dict(const dcr::owner_stats& s) {
  nb::dict d;
#define DCR_PY_OWNER_STAT(type, name) d[#name] = s.name;
  DCR_OWNER_STATS_FIELDS(DCR_PY_OWNER_STAT)
#undef DCR_PY_OWNER_STAT
  return d;
}

struct owner_with_encoder : py_owner {
  using py_owner::py_owner;
  dcr::payload_encoder encoder;
  std::vector<std::vector<std::byte>> payloads;
};

}  // namespace

void bind_owner(nb::module_& m) {
  nb::class_<py_owner>(m, "_OwnerBase");
  nb::class_<owner_with_encoder, py_owner>(m, "Owner",
      "The one data-parallel replica that compares a set of source shards with its trackers and "
      "emits their changes as payloads. Shards are passed in task order (affine tasks), residual "
      "inputs flattened in residual task order.")
      .def(nb::init<const dcr::tensor_registry&, std::uint32_t, std::vector<dcr::affine_task>,
                    std::vector<dcr::residual_task>>(),
           nb::arg("registry"), nb::arg("id"), nb::arg("tasks"),
           nb::arg("residual") = std::vector<dcr::residual_task>{}, nb::keep_alive<1, 2>())
      .def_prop_ro("id", [](py_owner& o) { return o.get().id(); })
      .def_prop_ro("shards", &py_owner::shard_names, "Shard names in task order.")
      .def_prop_ro("residual_input_count", [](py_owner& o) { return o.get().residual_input_count(); })
      .def_prop_ro("tracker_bytes", [](py_owner& o) { return o.get().tracker_bytes(); })
      .def("initialize",
           [](py_owner& o, const std::vector<tensor_arg>& shards, const std::vector<tensor_arg>& inputs) {
             std::vector<std::span<const std::byte>> s, in;
             o.spans(shards, inputs, s, in, "Owner.initialize");
             nb::gil_scoped_release release;
             o.get().initialize(s, in);
           },
           nb::arg("shards"), nb::arg("residual_inputs") = std::vector<tensor_arg>{},
           "Sets the trackers (and residual baselines) to the committed shards.")
      .def("build_payloads",
           [](owner_with_encoder& o, const std::vector<tensor_arg>& shards, std::uint64_t base,
              std::uint64_t target, std::uint32_t attempt, const std::vector<tensor_arg>& inputs,
              const std::string& policy, const std::string& mode, std::size_t bucket_bytes) {
             std::vector<std::span<const std::byte>> s, in;
             o.spans(shards, inputs, s, in, "Owner.build_payloads");
             const auto p = policy_from_name(policy);
             const auto md = mode_from_name(mode);
             {
               nb::gil_scoped_release release;
               const auto& items = o.get().build_items(s, p, in, {}, md);
               dcr::payload_header h;
               h.id = dcr::payload_id{{base, target, attempt}, o.get().id(), 0};
               h.registry_fingerprint = o.registry().fingerprint();
               dcr::pack_payloads(o.registry(), h, items, bucket_bytes, o.encoder, o.payloads);
             }
             nb::list out;
             for (const auto& b : o.payloads) out.append(nb::bytes(b.data(), b.size()));
             return out;
           },
           nb::arg("shards"), nb::arg("base_version"), nb::arg("target_version"),
           nb::arg("attempt") = 0, nb::arg("residual_inputs") = std::vector<tensor_arg>{},
           nb::arg("policy") = "mixed", nb::arg("mode") = "changes",
           nb::arg("bucket_bytes") = std::size_t{64} << 20,
           "Detects, projects or converts, encodes and packs the changes of `shards` against the "
           "trackers into payloads (bytes) of transition base -> target. The GIL is released.")
      .def("commit",
           [](py_owner& o, const std::vector<tensor_arg>& shards, const std::vector<tensor_arg>& inputs) {
             std::vector<std::span<const std::byte>> s, in;
             o.spans(shards, inputs, s, in, "Owner.commit");
             nb::gil_scoped_release release;
             o.get().commit(s, in);
           },
           nb::arg("shards"), nb::arg("residual_inputs") = std::vector<tensor_arg>{},
           "After the joint commit: the trackers take the changed words of the last build.")
      .def("set_overwrite_only",
           [](py_owner& o, const std::vector<std::string>& names) {
             std::vector<dcr::tensor_id> ids;
             for (const auto& n : names) ids.push_back(o.registry().id(n));
             o.get().set_overwrite_only(ids);
           },
           nb::arg("tensors"), "Tensors some receiver takes only as overwrite records.")
      .def_prop_ro("stats", [](py_owner& o) { return stats_dict(o.get().stats()); },
                   "Counters and timings of the last build.");
}

}  // namespace dcr_py
