// python/src/io.cpp: whole checkpoints, as `dcr diff`, `dcr apply` and `dcr inspect` do them
// (dcr/io/checkpoint.hpp): reports come back as dicts with the CLI's --json field names.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <fstream>

#include "common.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/report_json.hpp"

namespace dcr_py {
namespace {

const char* encoding_names[3] = {"overwrite", "xor", "ulp"};

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
        [](const std::string& path) {
          auto kind = dcr::io::container_kind::delta;
          {
            std::ifstream in(path, std::ios::binary);
            char magic[8] = {};
            in.read(magic, 8);
            if (in.gcount() == 8 && std::memcmp(magic, dcr::io::delta_format::journal_magic.data(), 8) == 0)
              kind = dcr::io::container_kind::journal;
          }
          const auto file = dcr::io::delta_file::open(path, kind);
          nb::dict j;
          j["file"] = path;
          j["kind"] = kind == dcr::io::container_kind::delta ? "delta" : "journal";
          j["format_version"] = dcr::io::delta_format::version;
          j["bytes"] = file.bytes().size();
          char fp[17];
          std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(file.registry_fingerprint()));
          j["registry_fingerprint"] = std::string(fp);
          j["tensor_bytes"] = file.tensor_bytes();
          j["tensor_count"] = file.tensor_count();
          j["target_file_bytes"] = file.target_file_size();
          j["base_digest"] = file.base_digest().hex();
          j["result_digest"] = file.result_digest().hex();
          j["base_header_digest"] = file.base_header_digest().hex();
          j["target_header_digest"] = file.target_header_digest().hex();
          nb::list payloads;
          std::vector<dcr::item_entry> entries;
          for (std::size_t i = 0; i < file.payload_count(); ++i) {
            const auto h = dcr::payload_decoder::read_table(file.payload(i), entries);
            nb::dict p;
            p["index"] = i;
            p["bytes"] = file.payload(i).size();
            p["direction"] = file.is_undo(i) ? "undo" : "forward";
            p["owner"] = h.id.owner;
            p["sequence"] = h.id.sequence;
            nb::list items;
            for (const auto& e : entries) {
              nb::dict it;
              it["tensor_id"] = e.tensor;
              it["encoding"] = e.encoding_code < 3 ? encoding_names[e.encoding_code] : "unknown";
              it["records"] = e.count;
              it["location_bytes"] = e.location_size;
              it["value_bytes"] = e.value_size;
              items.append(it);
            }
            p["items"] = items;
            payloads.append(p);
          }
          j["payloads"] = payloads;
          return j;
        },
        nb::arg("delta"));
}

}  // namespace dcr_py
