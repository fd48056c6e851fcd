// dcr/detail/io/report_json.inl: the bodies of dcr/io/report_json.hpp (included at its end).
#pragma once

namespace dcr::io {

inline nlohmann::ordered_json report_json(const diff_report& r) {
  static constexpr const char* encodings[3] = {"overwrite", "xor", "ulp"};
  nlohmann::ordered_json j;
  j["tensors"] = r.tensors;
  j["changed_tensors"] = r.changed_tensors;
  j["elements"] = r.elements;
  j["changed_elements"] = r.changed_elements;
  j["change_rate"] =
      r.elements ? static_cast<double>(r.changed_elements) / static_cast<double>(r.elements) : 0.0;
  j["checkpoint_bytes"] = r.checkpoint_bytes;
  j["tensor_bytes"] = r.tensor_bytes;
  j["delta_bytes"] = r.delta_bytes;
  j["bytes_per_changed"] = r.changed_elements ? static_cast<double>(r.delta_bytes) /
                                                    static_cast<double>(r.changed_elements)
                                              : 0.0;
  j["compression_ratio"] =
      r.delta_bytes ? static_cast<double>(r.checkpoint_bytes) / static_cast<double>(r.delta_bytes)
                    : 0.0;
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
  j["read_gb_per_s"] =
      r.seconds > 0 ? 2.0 * static_cast<double>(r.tensor_bytes) / r.seconds / 1e9 : 0.0;
  return j;
}

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

namespace dcr::io::detail {

inline const char* encoding_name(std::uint8_t code) {
  switch (code) {
    case 0:
      return "overwrite";
    case 1:
      return "xor";
    case 2:
      return "ulp";
    default:
      return "unknown";
  }
}

inline const char* location_coding_name(std::uint8_t code) {
  constexpr std::array<const char*, 4> names = {"skip_varint", "skip_buckets", "bitmap", "runs"};
  return code < names.size() ? names[code] : "unknown";
}

inline const char* value_coding_name(std::uint8_t code) {
  constexpr std::array<const char*, 5> names = {"raw", "byte_planes", "zigzag_planes", "buckets",
                                                "zigzag_buckets"};
  return code < names.size() ? names[code] : "unknown";
}

}  // namespace dcr::io::detail

namespace dcr::io {

inline nlohmann::ordered_json inspect_json(const delta_file& d, const std::string& file) {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["file"] = file;
  j["kind"] = d.kind() == container_kind::delta ? "delta" : "journal";
  j["format_version"] = delta_format::version;
  j["bytes"] = d.bytes().size();
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof fingerprint, "%016llx",
                static_cast<unsigned long long>(d.registry_fingerprint()));
  j["registry_fingerprint"] = std::string(fingerprint);
  j["tensor_count"] = d.tensor_count();
  j["tensor_bytes"] = d.tensor_bytes();
  j["target_file_bytes"] = d.target_file_size();
  j["target_header_bytes"] = d.target_header_size();
  j["target_header_code_bytes"] = d.target_header_code().size();
  j["base_header_digest"] = d.base_header_digest().hex();
  j["target_header_digest"] = d.target_header_digest().hex();
  j["base_digest"] = d.base_digest().hex();
  j["result_digest"] = d.result_digest().hex();
  j["changed"] =
      d.base_digest() != d.result_digest() || d.base_header_digest() != d.target_header_digest();
  const auto name_of = [&](std::uint64_t id) -> ojson {
    if (!d.bound()) return nullptr;
    return id < d.registry().size() ? ojson(d.registry().tensors()[id].name) : ojson("?");
  };
  ojson payloads = ojson::array();
  std::vector<item_entry> entries;
  std::vector<bool> changed(d.tensor_count(), false);
  std::uint64_t records = 0;
  for (std::size_t i = 0; i < d.payload_count(); ++i) {
    const auto h = blame(input_fault::delta,
                         [&] { return payload_decoder::read_table(d.payload(i), entries); });
    ojson p;
    p["index"] = i;
    p["offset"] = d.payload_offset(i);
    p["bytes"] = d.payload(i).size();
    p["direction"] = d.is_undo(i) ? "undo" : "forward";
    p["base_version"] = h.id.attempt.base_version;
    p["target_version"] = h.id.attempt.target_version;
    p["attempt"] = h.id.attempt.number;
    p["owner"] = h.id.owner;
    p["sequence"] = h.id.sequence;
    ojson items = ojson::array();
    for (const auto& e : entries) {
      ojson it;
      it["tensor_id"] = e.tensor;
      it["tensor"] = name_of(e.tensor);
      const auto type = dcr::dtype_from_code(e.dtype_code);
      it["dtype"] = type ? std::string(dcr::dtype_name(*type)) : "?";
      it["count"] = e.count;
      it["numel"] = e.numel;
      it["encoding"] = detail::encoding_name(e.encoding_code);
      it["location_coding"] = detail::location_coding_name(e.location_code);
      it["value_coding"] = detail::value_coding_name(e.value_code);
      it["location_bytes"] = e.location_size;
      it["location_raw_bytes"] = e.location_raw_size;
      it["value_bytes"] = e.value_size;
      it["value_raw_bytes"] = e.value_raw_size;
      if (e.tensor < changed.size()) changed[e.tensor] = true;
      records += e.count;
      items.push_back(std::move(it));
    }
    p["items"] = std::move(items);
    payloads.push_back(std::move(p));
  }
  std::uint64_t changed_tensors = 0;
  for (bool c : changed) changed_tensors += c ? 1 : 0;
  j["changed_tensors"] = changed_tensors;
  j["payload_count"] = d.payload_count();
  j["records"] = records;
  // With a base: the result's metadata and the tensors by name (changed: has items).
  ojson tensors = nullptr;
  j["metadata"] = nullptr;
  if (d.bound()) {
    const auto& target = d.target_header();
    if (target.metadata()) {
      ojson m = ojson::object();
      for (const auto& [k, v] : *target.metadata()) m[k] = v;
      j["metadata"] = m;
    }
    tensors = ojson::array();
    for (dcr::tensor_id id = 0; id < d.registry().size(); ++id) {
      const auto& t = d.registry().tensors()[id];
      ojson e;
      e["id"] = id;
      e["name"] = t.name;
      e["dtype"] = std::string(dcr::dtype_name(t.type));
      e["shape"] = t.shape;
      e["bytes"] = t.bytes();
      e["changed"] = static_cast<bool>(changed[id]);
      tensors.push_back(std::move(e));
    }
  }
  j["tensors"] = std::move(tensors);
  j["payloads"] = std::move(payloads);
  return j;
}

inline delta_file open_for_inspect(const std::filesystem::path& path,
                                   const std::optional<std::filesystem::path>& base) {
  auto kind = container_kind::delta;
  {
    std::ifstream in(path, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    if (in.gcount() == 8 && std::memcmp(magic, delta_format::journal_magic.data(), 8) == 0)
      kind = container_kind::journal;
  }
  auto d = blame(input_fault::delta, [&] { return delta_file::open(path, kind); });
  if (base && kind == container_kind::delta) {
    const auto f = blame(input_fault::checkpoint, [&] { return safetensors_file::open(*base); });
    detail::bind_delta_base(d, f, "BASE '" + base->string() + "'");
  }
  return d;
}

}  // namespace dcr::io
