// dcr/io/report_json.hpp: the JSON form of the whole-checkpoint reports (diff_report,
// apply_report), one definition for every front end: `dcr diff/apply --json` add the paths and
// options they were given; the Python package returns the same fields as dicts. Needs
// nlohmann-json, like the rest of dcr/io.
#pragma once

#include <nlohmann/json.hpp>

#include "dcr/io/checkpoint.hpp"

namespace dcr::io {

/// The fields of a diff report, named as `dcr diff --json` prints them.
inline nlohmann::ordered_json report_json(const diff_report& r) {
  static constexpr const char* encodings[3] = {"overwrite", "xor", "ulp"};
  nlohmann::ordered_json j;
  j["tensors"] = r.tensors;
  j["changed_tensors"] = r.changed_tensors;
  j["elements"] = r.elements;
  j["changed_elements"] = r.changed_elements;
  j["change_rate"] = r.elements ? static_cast<double>(r.changed_elements) / static_cast<double>(r.elements) : 0.0;
  j["checkpoint_bytes"] = r.checkpoint_bytes;
  j["tensor_bytes"] = r.tensor_bytes;
  j["delta_bytes"] = r.delta_bytes;
  j["bytes_per_changed"] =
      r.changed_elements ? static_cast<double>(r.delta_bytes) / static_cast<double>(r.changed_elements) : 0.0;
  j["compression_ratio"] =
      r.delta_bytes ? static_cast<double>(r.checkpoint_bytes) / static_cast<double>(r.delta_bytes) : 0.0;
  j["payloads"] = r.payloads;
  j["items"] = r.items;
  nlohmann::ordered_json by_enc, records;
  for (std::size_t e = 0; e < r.items_by_encoding.size(); ++e) {
    by_enc[encodings[e]] = r.items_by_encoding[e];
    records[encodings[e]] = r.records_by_encoding[e];
  }
  j["items_by_encoding"] = by_enc;
  j["records_by_encoding"] = records;
  j["seconds"] = r.seconds;
  j["scan_seconds"] = r.scan_seconds;
  j["encode_seconds"] = r.encode_seconds;
  j["write_seconds"] = r.write_seconds;
  j["read_gb_per_s"] = r.seconds > 0 ? 2.0 * static_cast<double>(r.tensor_bytes) / r.seconds / 1e9 : 0.0;
  return j;
}

/// The fields of an apply report, named as `dcr apply --json` prints them.
inline nlohmann::ordered_json report_json(const apply_report& r) {
  nlohmann::ordered_json j;
  j["tensors"] = r.tensors;
  j["payloads"] = r.payloads;
  j["changed_elements"] = r.records;
  j["output_bytes"] = r.output_bytes;
  j["already_applied"] = r.already_applied;
  j["recovered"] = r.recovered;
  j["verified"] = true;  // apply refuses to publish an unverified result
  j["seconds"] = r.seconds;
  return j;
}

}  // namespace dcr::io
