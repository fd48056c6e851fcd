// python/src/io.cpp: whole checkpoints, as `dcr diff`, `dcr apply` and `dcr inspect` do them
// (dcr/io/checkpoint.hpp): reports come back as dicts with the CLI's --json field names
// (dcr/io/report_json.hpp).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <filesystem>
#include <optional>

#include "common.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/report_json.hpp"

namespace dcr_py {
namespace {

nb::object dict_of(const nlohmann::ordered_json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump());
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def("_diff",
        [](const std::string& old_path, const std::string& new_path, const std::string& out,
           const std::string& encoding, int level, std::size_t payload_records) {
          dcr::io::diff_options o;
          if (encoding == "mixed") o.policy = dcr::encoding_policy::mixed;
          else if (encoding == "xor") o.policy = dcr::encoding_policy::xor_only;
          else if (encoding == "ulp") o.policy = dcr::encoding_policy::ulp_only;
          else if (encoding == "overwrite") o.policy = dcr::encoding_policy::overwrite_only;
          else throw dcr::error(dcr::errc::invalid_argument,
                                "dcr.diff: encoding '" + encoding + "' (expected mixed, xor, ulp or overwrite)");
          o.zstd_level = level;
          DCR_EXPECTS(payload_records >= 1, dcr::errc::invalid_argument, "dcr.diff: payload_records must be >= 1");
          o.payload_records = payload_records;
          dcr::io::diff_report r;
          {
            nb::gil_scoped_release release;
            r = dcr::io::diff_checkpoints(old_path, new_path, out, o);
          }
          return dict_of(dcr::io::report_json(r));
        },
        nb::arg("old"), nb::arg("new"), nb::arg("out"), nb::arg("encoding") = "mixed", nb::arg("level") = 1,
        nb::arg("payload_records") = std::size_t{1} << 21);

  m.def("_apply",
        [](const std::string& delta, const std::string& base, std::optional<std::string> out) {
          dcr::io::apply_report r;
          {
            nb::gil_scoped_release release;
            r = out ? dcr::io::apply_delta(delta, base, *out)
                    : dcr::io::apply_delta_in_place(delta, base, dcr::io::in_place_options_from_environment());
          }
          return dict_of(dcr::io::report_json(r));
        },
        nb::arg("delta"), nb::arg("base"), nb::arg("out") = nb::none());

  m.def("_inspect",
        [](const std::string& path, std::optional<std::string> base) {
          nlohmann::ordered_json j;
          {
            nb::gil_scoped_release release;
            const auto d = dcr::io::open_for_inspect(
                path, base ? std::optional<std::filesystem::path>(*base) : std::nullopt);
            j = dcr::io::inspect_json(d, path);
          }
          return dict_of(j);
        },
        nb::arg("delta"), nb::arg("base") = nb::none());
}

}  // namespace dcr_py
