// dcr/io/report_json.hpp: the JSON form of the whole-checkpoint reports (diff_report,
// apply_report) and of an inspected delta file or journal (inspect_json, open_for_inspect), one
// definition for every front end: `dcr diff/apply/inspect --json` add the paths and options they
// were given; the Python package returns the same fields as dicts. Needs nlohmann-json, like
// the rest of dcr/io.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dcr/io/checkpoint.hpp"

namespace dcr::io {

/// The fields of a diff report, named as `dcr diff --json` prints them.
nlohmann::ordered_json report_json(const diff_report& r);

/// The fields of an apply report, named as `dcr apply --json` prints them.
nlohmann::ordered_json report_json(const apply_report& r);

namespace detail {

// The names docs/format.md gives the codes of an item table entry.
const char* encoding_name(std::uint8_t code);
const char* location_coding_name(std::uint8_t code);
const char* value_coding_name(std::uint8_t code);

}  // namespace detail

/// What `dcr inspect --json` prints about one delta file or journal (docs/tool.md, `dcr
/// inspect`), named `file` there: the container's header fields and digests, and every
/// payload's items with their codings and stream sizes. The tensors by name ("tensors": id,
/// name, dtype, shape, bytes, changed) and the result's metadata only when `d` is bound to its
/// base (a journal always is; a delta names no tensor); null otherwise.
nlohmann::ordered_json inspect_json(const delta_file& d, const std::string& file);

/// The container at `path` as `dcr inspect` reads it: an in-place journal if it starts with the
/// journal magic, else a delta file (its errors are input_fault::delta). With `base` (for a
/// delta; a journal holds its base's header), that safetensors file is checked against the
/// delta as apply checks it (tensors and header, not the tensor bytes: input_fault::wrong_base)
/// and bound to it, so that inspect_json lists the tensors by name.
[[nodiscard]] delta_file open_for_inspect(const std::filesystem::path& path,
                                          const std::optional<std::filesystem::path>& base);

}  // namespace dcr::io

#include "dcr/detail/io/report_json.inl"
