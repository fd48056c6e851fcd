// python/src/receiver.cpp: the receiver behind dcr.Receiver (recorded loader, compiled apply).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "receiver.hpp"

namespace dcr_py {
namespace {

dcr::index_array index_array_of(const std::vector<std::int64_t>& v, const std::string& what) {
  DCR_EXPECTS(v.size() <= static_cast<std::size_t>(dcr::max_rank), dcr::errc::invalid_argument,
              what + ": rank " + std::to_string(v.size()) + " exceeds dcr::max_rank");
  dcr::index_array a{};
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = v[i];
  return a;
}

nb::dict receiver_stats_dict(const dcr::receiver_stats& s) {
  nb::dict d;
  d["payloads_applied"] = s.payloads_applied;
  d["duplicates_dropped"] = s.duplicates_dropped;
  d["payload_bytes"] = s.payload_bytes;
  d["records"] = s.records;
  d["writes"] = s.writes;
  d["verified"] = s.verified;
  d["decode_seconds"] = s.decode_seconds;
  d["apply_seconds"] = s.apply_seconds;
  return d;
}

}  // namespace

void bind_receiver(nb::module_& m) {
  nb::class_<dcr::receiver_endpoint>(m, "_ReceiverEndpoint");
  nb::class_<py_receiver>(m, "_Receiver")
      .def(nb::init<const dcr::tensor_registry&>(), nb::arg("registry"), nb::keep_alive<1, 2>())
      .def("_clear", [](py_receiver& r) { r.loader.clear(); })
      .def("_add_copy",
           [](py_receiver& r, const std::string& tensor, std::uintptr_t dst, const std::string& dst_dtype,
              const std::vector<std::int64_t>& extents, const std::vector<std::int64_t>& dst_strides,
              std::int64_t src_offset, const std::vector<std::int64_t>& src_strides) {
             const auto id = r.registry->id(tensor);
             const auto& t = r.registry->at(id);
             const std::string where = "dcr loader: a copy of tensor '" + tensor + "'";
             DCR_EXPECTS(extents.size() == dst_strides.size() && extents.size() == src_strides.size(),
                         dcr::errc::invalid_argument, where + ": extents and strides differ in rank");
             recorded_copy c;
             const auto to = dtype_from_name(dst_dtype, where);
             try {
               c.transform = dcr::element_transform::cast(t.type, to);
             } catch (const dcr::error&) {
               throw dcr::error(dcr::errc::unsupported_loader_path,
                                where + " converts " + std::string(dcr::dtype_name(t.type)) + " to " +
                                    dst_dtype + ", a cast dcr cannot reproduce on stored bits "
                                    "(only BF16, F16 and F32 convert among themselves)");
             }
             c.dst = dst;
             c.dst_bytes = static_cast<std::uint8_t>(dcr::dtype_size(to));
             c.rank = static_cast<int>(extents.size());
             c.extents = index_array_of(extents, where);
             c.dst_strides = index_array_of(dst_strides, where);
             c.src_strides = index_array_of(src_strides, where);
             c.src_offset = src_offset;
             r.loader.add_copy(id, c);
           },
           nb::arg("tensor"), nb::arg("dst"), nb::arg("dst_dtype"), nb::arg("extents"),
           nb::arg("dst_strides"), nb::arg("src_offset"), nb::arg("src_strides"))
      .def("_add_skip", [](py_receiver& r, const std::string& tensor) { r.loader.add_skip(r.registry->id(tensor)); },
           nb::arg("tensor"))
      .def("_add_tie", [](py_receiver& r, const std::string& first, const std::string& second) {
             r.loader.add_tie(first, second);
           },
           nb::arg("first"), nb::arg("second"))
      .def("_prewarm",
           [](py_receiver& r) {
             nb::gil_scoped_release release;
             r.rx.prewarm();
           },
           "Compiles the recorded copies into the placement (every loader condition checked).")
      .def("_load",
           [](py_receiver& r, const std::string& tensor, const tensor_arg& words) {
             const auto id = r.registry->id(tensor);
             const auto& t = r.registry->at(id);
             const auto bytes = tensor_bytes(words.first, t.type, static_cast<std::uint64_t>(t.numel()),
                                             "Receiver.load: tensor '" + tensor + "'", words.second);
             nb::gil_scoped_release release;
             dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
               using W = decltype(w);
               r.rx.template dense_load<W>(
                   id, dcr::tensor_view<const W>::contiguous(reinterpret_cast<const W*>(bytes.data()), t.shape));
             });
           },
           nb::arg("tensor"), nb::arg("words"))
      .def("begin_attempt",
           [](py_receiver& r, std::uint64_t base, std::uint64_t target, std::uint32_t attempt) {
             r.rx.begin_attempt(dcr::attempt_key{base, target, attempt});
           },
           nb::arg("base_version"), nb::arg("target_version"), nb::arg("attempt") = 0,
           "Accepts payloads of this attempt only (others are StalePayload).")
      .def("apply_payload",
           [](py_receiver& r, nb::bytes payload) {
             const auto* p = static_cast<const std::byte*>(payload.data());
             const std::span<const std::byte> bytes(p, payload.size());
             dcr::apply_outcome o;
             {
               nb::gil_scoped_release release;
               o = r.rx.apply_payload(bytes);
             }
             return o == dcr::apply_outcome::applied ? "applied" : "duplicate";
           },
           nb::arg("payload"),
           "Validates, deduplicates and applies one payload in place through the compiled "
           "placement (no Python runs). Returns 'applied' or 'duplicate'; on error nothing is "
           "written.")
      .def("end_transition", [](py_receiver& r, std::uint64_t v) { r.rx.end_transition(v); }, nb::arg("version"))
      .def_prop_rw("path",
           [](py_receiver& r) { return r.rx.options().path == dcr::apply_path::compiled ? "compiled" : "general"; },
           [](py_receiver& r, const std::string& p) {
             DCR_EXPECTS(p == "compiled" || p == "general", dcr::errc::invalid_argument,
                         "Receiver.path: '" + p + "' (expected compiled or general)");
             auto o = r.rx.options();
             o.path = p == "compiled" ? dcr::apply_path::compiled : dcr::apply_path::general;
             r.rx.set_options(o);
           }, "The apply path: compiled (placement from prewarm) or general (loader per item).")
      .def_prop_rw("verify", [](py_receiver& r) { return r.rx.options().verify; },
           [](py_receiver& r, bool v) {
             auto o = r.rx.options();
             o.verify = v;
             r.rx.set_options(o);
           }, "Post-apply checks of every write.")
      .def("placement_report",
           [](py_receiver& r) {
             nb::list out;
             for (const auto& p : r.rx.placement_report()) {
               nb::dict d;
               d["tensor"] = std::string(p.name);
               d["skipped"] = p.skipped;
               d["copies"] = p.copies;
               d["placements"] = p.placements;
               d["elements"] = p.elements;
               d["overwrite_only"] = p.overwrite_only;
               d["reason"] = p.reason;
               out.append(d);
             }
             return out;
           }, "Per tensor: skipped, copies, compiled records, elements, overwrite-only and why.")
      .def("overwrite_only_tensors",
           [](py_receiver& r) {
             std::vector<std::string> names;
             for (auto id : r.rx.overwrite_only_tensors()) names.push_back(r.registry->at(id).name);
             return names;
           })
      .def_prop_ro("stats", [](py_receiver& r) { return receiver_stats_dict(r.rx.stats()); })
      .def_prop_ro("committed_version", [](py_receiver& r) { return r.rx.committed_version(); });
}

}  // namespace dcr_py
