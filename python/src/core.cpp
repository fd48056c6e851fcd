// python/src/core.cpp: the registry, the mapping classes, affine and residual tasks, ownership.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

#include "common.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/mapping.hpp"
#include "dcr/refit/ownership.hpp"
#include "dcr/refit/residual.hpp"
#include "dcr/refit/task.hpp"

namespace dcr_py {
namespace {

using entry = std::tuple<std::string, std::string, std::vector<std::int64_t>>;

entry entry_of(const dcr::canonical_tensor& t) {
  return {t.name, std::string(dcr::dtype_name(t.type)), t.shape};
}

std::vector<dcr::tensor_id> ids_of(const dcr::tensor_registry& r,
                                   const std::vector<std::string>& names) {
  std::vector<dcr::tensor_id> ids;
  ids.reserve(names.size());
  for (const auto& n : names) ids.push_back(r.id(n));
  return ids;
}

// A Python callable shared by copies of a std::function without touching its reference count
// off the GIL; released with the GIL held.
struct shared_callable {
  std::shared_ptr<nb::object> fn;
  explicit shared_callable(nb::object f)
      : fn(new nb::object(std::move(f)), [](nb::object* o) {
          nb::gil_scoped_acquire gil;
          delete o;
        }) {}
};

// 1-d NumPy array of unsigned words over `bytes`, no copy (rv_policy::reference): valid for the
// duration of the call only.
template <bool Writable>
nb::object word_array(std::conditional_t<Writable, std::span<std::byte>, std::span<const std::byte>> bytes,
                      dcr::dtype type) {
  const std::size_t shape[1] = {bytes.size() / dcr::dtype_size(type)};
  const nb::dlpack::dtype dt{static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt),
                             static_cast<std::uint8_t>(8 * dcr::dtype_size(type)), 1};
  void* data = const_cast<std::byte*>(bytes.data());
  if constexpr (Writable) {
    return nb::cast(nb::ndarray<nb::numpy>(data, 1, shape, nb::handle(), nullptr, dt), nb::rv_policy::reference);
  } else {
    return nb::cast(nb::ndarray<nb::numpy, nb::ro>(data, 1, shape, nb::handle(), nullptr, dt), nb::rv_policy::reference);
  }
}

// What every mapping class offers Python: its local size and the projection of one local
// index to (part, canonical index). `cls` is the class being bound (an nb::class_).
template <class Class>
void add_mapping_members(Class&& cls) {
  using mapping_type = typename std::remove_cvref_t<Class>::Type;
  cls.def_prop_ro("local_size", &mapping_type::local_size)
      .def("__call__", [](const mapping_type& b, std::uint64_t i) {
        const auto r = b(i);
        return std::make_pair(r.part, r.index);
      }, nb::arg("local_index"), "(part, canonical flat index) of a local index.");
}

// The registry: canonical tensors (name, dtype, shape) and their ids.
void bind_registry(nb::module_& m) {
  m.def("dtype_size", [](const std::string& name) { return dcr::dtype_size(dtype_from_name(name, "dtype_size")); },
        nb::arg("dtype"), "Bytes per element of a dtype named as safetensors names it.");

  nb::class_<dcr::tensor_registry>(m, "Registry",
      "The canonical tensors of one model (Hugging Face names, dtypes, shapes) with stable ids "
      "(positions in name order) and a fingerprint every payload carries.")
      .def("__init__",
           [](dcr::tensor_registry* self, const std::vector<entry>& entries) {
             std::vector<dcr::canonical_tensor> ts;
             ts.reserve(entries.size());
             for (const auto& [name, type, shape] : entries)
               ts.push_back({name, dtype_from_name(type, "Registry: tensor '" + name + "'"), shape});
             new (self) dcr::tensor_registry(std::move(ts));
           },
           nb::arg("entries"), "From (name, dtype name, shape) entries.")
      .def_static("from_safetensors",
           [](const std::string& path) {
             const auto f = dcr::io::safetensors_file::open(path);
             return dcr::tensor_registry(f.header().canonical_tensors());
           },
           nb::arg("path"), "From the header of a safetensors file (its tensors' names, dtypes, shapes).")
      .def("__len__", &dcr::tensor_registry::size)
      .def("__contains__", [](const dcr::tensor_registry& r, const std::string& n) { return r.find(n).has_value(); })
      .def_prop_ro("fingerprint", &dcr::tensor_registry::fingerprint)
      .def_prop_ro("total_bytes", &dcr::tensor_registry::total_bytes)
      .def("names", [](const dcr::tensor_registry& r) {
             std::vector<std::string> n;
             for (const auto& t : r.tensors()) n.push_back(t.name);
             return n;
           }, "Tensor names in id order.")
      .def("entries", [](const dcr::tensor_registry& r) {
             std::vector<entry> e;
             for (const auto& t : r.tensors()) e.push_back(entry_of(t));
             return e;
           }, "(name, dtype, shape) in id order.")
      .def("id", &dcr::tensor_registry::id, nb::arg("name"), "The id of a tensor; UnknownTensor if absent.")
      .def("tensor", [](const dcr::tensor_registry& r, const std::string& n) { return entry_of(r.at(r.id(n))); },
           nb::arg("name"), "(name, dtype, shape) of a tensor; UnknownTensor if absent.");
}

// The mapping classes (dcr/mapping/*.hpp): the projection of a source shard.
void bind_mappings(nb::module_& m) {
  add_mapping_members(nb::class_<dcr::box>(m, "box", "A box [offsets, offsets + extents) of a canonical tensor, axes optionally permuted.")
      .def("__init__",
           [](dcr::box* self, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& offsets,
              const std::vector<std::int64_t>& extents, const std::vector<int>& axes) {
             new (self) dcr::box(shape, offsets, extents, axes);
           },
           nb::arg("shape"), nb::arg("offsets"), nb::arg("extents"), nb::arg("axes") = std::vector<int>{})
      .def("is_exhaustive", &dcr::box::is_exhaustive));
  add_mapping_members(nb::class_<dcr::replicated>(m, "replicated", "The whole canonical tensor (norms, biases of row-parallel layers).")
      .def("__init__", [](dcr::replicated* self, const std::vector<std::int64_t>& shape) {
             std::int64_t n = 1;
             for (auto e : shape) {
               DCR_EXPECTS(e >= 0, dcr::errc::invalid_argument, "replicated: negative extent in " + shape_text(shape));
               n *= e;
             }
             new (self) dcr::replicated(static_cast<std::uint64_t>(n));
           }, nb::arg("shape")));
  add_mapping_members(nb::class_<dcr::row_split>(m, "row_split", "Rank `rank` of `world` holds a balanced range of rows (dimension 0).")
      .def("__init__", [](dcr::row_split* self, const std::vector<std::int64_t>& shape, int world, int rank) {
             new (self) dcr::row_split(shape, world, rank);
           }, nb::arg("shape"), nb::arg("world"), nb::arg("rank"))
      .def_prop_ro("first_row", &dcr::row_split::first_row)
      .def_prop_ro("rows", &dcr::row_split::rows));
  add_mapping_members(nb::class_<dcr::column_split>(m, "column_split", "Rank `rank` of `world` holds a balanced range of columns (the last dimension).")
      .def("__init__", [](dcr::column_split* self, const std::vector<std::int64_t>& shape, int world, int rank) {
             new (self) dcr::column_split(shape, world, rank);
           }, nb::arg("shape"), nb::arg("world"), nb::arg("rank"))
      .def_prop_ro("first_column", &dcr::column_split::first_column)
      .def_prop_ro("local_columns", &dcr::column_split::local_columns));
  add_mapping_members(nb::class_<dcr::stacked>(m, "stacked", "A stacked source [E, ...] whose slice e maps through `inner` into target e.")
      .def("__init__", [](dcr::stacked* self, std::uint32_t experts, const dcr::box& inner) {
             new (self) dcr::stacked(experts, inner);
           }, nb::arg("experts"), nb::arg("inner"))
      .def_static("expert_of_stack", &dcr::stacked::expert_of_stack, nb::arg("stack_shape"), nb::arg("expert")));
}

// Affine and residual tasks, validated against the registry as they are made.
void bind_tasks(nb::module_& m) {
  nb::class_<dcr::affine_task>(m, "AffineTask",
      "A source shard that maps element-wise into canonical tensors through a mapping class.")
      .def("__init__",
           [](dcr::affine_task* self, const dcr::tensor_registry& registry, const std::string& shard,
              const dcr::any_mapping& mapping, const std::vector<std::string>& targets,
              std::optional<std::string> type, bool delta_encodable) {
             DCR_EXPECTS(!targets.empty(), dcr::errc::invalid_argument,
                         "AffineTask '" + shard + "': no target tensor");
             dcr::affine_task t;
             t.shard_name = shard;
             t.mapping = mapping;
             t.targets = ids_of(registry, targets);
             t.type = type ? dtype_from_name(*type, "AffineTask '" + shard + "'")
                           : registry.at(t.targets[0]).type;
             t.delta_encodable = delta_encodable;
             dcr::validate_task(t, registry);
             new (self) dcr::affine_task(std::move(t));
           },
           nb::arg("registry"), nb::arg("shard"), nb::arg("mapping"), nb::arg("targets"),
           nb::arg("dtype") = nb::none(), nb::arg("delta_encodable") = true,
           "Validated against the registry: dtype and element counts of every target "
           "(DtypeMismatch, ShapeMismatch, UnknownTensor naming the shard).")
      .def_prop_ro("shard", [](const dcr::affine_task& t) { return t.shard_name; })
      .def_prop_ro("dtype", [](const dcr::affine_task& t) { return std::string(dcr::dtype_name(t.type)); })
      .def_prop_ro("local_size", &dcr::affine_task::local_size)
      .def_prop_ro("bytes", &dcr::affine_task::bytes)
      .def_prop_ro("targets", [](const dcr::affine_task& t) { return t.targets; });

  nb::class_<dcr::residual_task>(m, "_ResidualTask")
      .def("__init__",
           [](dcr::residual_task* self, const dcr::tensor_registry& registry, const std::string& name,
              const std::vector<std::tuple<std::string, std::string, std::uint64_t>>& inputs,
              const std::vector<std::pair<std::string, std::vector<std::uint32_t>>>& outputs,
              nb::object convert) {
             dcr::residual_task t;
             t.name = name;
             for (const auto& [in_name, type, elements] : inputs)
               t.inputs.push_back({in_name, dtype_from_name(type, "residual task '" + name + "': input '" + in_name + "'"), elements});
             for (const auto& [out_name, deps] : outputs) t.outputs.push_back({registry.id(out_name), deps});
             DCR_EXPECTS(PyCallable_Check(convert.ptr()), dcr::errc::invalid_argument,
                         "residual task '" + name + "': convert is not callable");
             // The owner calls this with the GIL released (from build and initialize); the
             // callable gets word arrays valid for the call only.
             std::vector<dcr::dtype> in_types;
             for (const auto& in : t.inputs) in_types.push_back(in.type);
             std::vector<dcr::dtype> out_types;
             std::vector<std::string> out_names;
             for (const auto& o : t.outputs) {
               out_types.push_back(registry.at(o.tensor).type);
               out_names.push_back(registry.at(o.tensor).name);
             }
             shared_callable fn(std::move(convert));
             t.convert = [fn, in_types, out_types, out_names, name](
                             std::size_t output, std::span<const std::span<const std::byte>> ins,
                             std::span<std::byte> dst) {
               nb::gil_scoped_acquire gil;
               try {
                 nb::list arrays;
                 for (std::size_t k = 0; k < ins.size(); ++k) arrays.append(word_array<false>(ins[k], in_types[k]));
                 (*fn.fn)(output, arrays, word_array<true>(dst, out_types[output]));
               } catch (nb::python_error& e) {
                 const std::string what = python_error_text(e);
                 throw dcr::error(dcr::errc::invalid_argument,
                                  "residual task '" + name + "': conversion of '" + out_names[output] +
                                      "' raised " + what);
               }
             };
             dcr::validate_residual_task(t, registry);
             new (self) dcr::residual_task(std::move(t));
           },
           nb::arg("registry"), nb::arg("name"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("convert"))
      .def_prop_ro("name", [](const dcr::residual_task& t) { return t.name; })
      .def_prop_ro("input_bytes", &dcr::residual_task::input_bytes);
}

// Ownership (dcr/refit/ownership.hpp): which rank compares which shard.
void bind_ownership(nb::module_& m) {
  m.def("assign_owners",
        [](const std::vector<std::tuple<std::string, std::uint64_t, std::vector<std::uint32_t>>>& shards) {
          std::vector<dcr::shard_holding> h;
          for (const auto& [name, bytes, holders] : shards) h.push_back({name, bytes, holders});
          return dcr::assign_owners(h);
        },
        nb::arg("shards"),
        "Owner rank of each (name, bytes, holder ranks) shard: one holder per identical copy, "
        "balanced by bytes, the same on every rank.");
  m.def("residual_owner",
        [](const std::string& name, const std::vector<std::uint32_t>& eligible) {
          return dcr::residual_owner(name, eligible);
        },
        nb::arg("name"), nb::arg("eligible"), "The owner of a residual task among the eligible ranks.");
}

}  // namespace

void bind_core(nb::module_& m) {
  bind_registry(m);
  bind_mappings(m);
  bind_tasks(m);
  bind_ownership(m);
}

}  // namespace dcr_py
