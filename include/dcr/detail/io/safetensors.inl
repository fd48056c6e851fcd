// dcr/detail/io/safetensors.inl: the bodies of dcr/io/safetensors.hpp (included at its end).
#pragma once

namespace dcr::io {

inline safetensors_header::safetensors_header(
    std::uint64_t header_size, std::uint64_t buffer_size,
    std::vector<safetensors_entry> tensors_in_offset_order,
    std::optional<safetensors_metadata> metadata)
    : header_size_(header_size),
      buffer_size_(buffer_size),
      tensors_(std::move(tensors_in_offset_order)),
      metadata_(std::move(metadata)) {
  by_name_.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

inline const std::optional<safetensors_metadata>& safetensors_header::metadata() const noexcept {
  return metadata_;
}

inline const safetensors_entry* safetensors_header::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

inline std::vector<canonical_tensor> safetensors_header::canonical_tensors() const {
  std::vector<canonical_tensor> c;
  c.reserve(tensors_.size());
  for (const auto& t : tensors_) c.push_back(t.canonical());
  return c;
}

inline safetensors_file safetensors_file::open(const std::filesystem::path& path, bool populate) {
  safetensors_file f;
  f.file_ = mapped_file::open_read(path, populate);
  f.header_ = parse_safetensors(f.file_.bytes(), path.string());
  return f;
}

inline std::span<const safetensors_entry> safetensors_file::tensors() const noexcept {
  return header_.tensors();
}

inline const std::optional<safetensors_metadata>& safetensors_file::metadata() const noexcept {
  return header_.metadata();
}

inline const safetensors_entry* safetensors_file::find(std::string_view name) const {
  return header_.find(name);
}

inline std::string_view safetensors_file::header_json() const noexcept {
  return {reinterpret_cast<const char*>(file_.bytes().data() + 8),
          static_cast<std::size_t>(header_.header_size())};
}

inline std::span<const std::byte> safetensors_file::data(
    const safetensors_entry& t) const noexcept {
  return file_.bytes().subspan(static_cast<std::size_t>(header_.data_offset() + t.begin),
                               static_cast<std::size_t>(t.size()));
}

}  // namespace dcr::io

namespace dcr::io::detail {

inline std::string quoted(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q += '\'';
  q += s;
  q += '\'';
  return q;
}

inline std::string printable(std::span<const std::byte> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "\"";
  for (auto b : bytes) {
    const auto c = static_cast<unsigned char>(b);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      s += static_cast<char>(c);
    } else {
      s += "\\x";
      s += digits[c >> 4];
      s += digits[c & 15];
    }
  }
  return s + "\"";
}

inline std::uint64_t json_u64(const nlohmann::json& v, bool& ok) {
  if (!v.is_number_unsigned()) {
    ok = false;
    return 0;
  }
  return v.get<std::uint64_t>();
}

}  // namespace dcr::io::detail

namespace dcr::io {

inline void write_safetensors(const std::filesystem::path& path,
                              std::span<const safetensors_tensor> tensors,
                              const std::optional<safetensors_metadata>& metadata) {
  const std::string json = make_safetensors_header(tensors, metadata);
  atomic_file out(path);
  std::byte length[8];
  dcr::detail::store_le<std::uint64_t>(length, json.size());
  out.write_at(length, 0);
  out.write_at(std::as_bytes(std::span<const char>(json)), 8);
  std::uint64_t at = 8 + json.size();
  for (const auto& t : tensors) {
    out.write_at(t.data, at);
    at += t.data.size();
  }
  out.commit();
}

inline safetensors_header parse_safetensors_header(std::string_view json,
                                                   std::uint64_t buffer_size,
                                                   std::string_view where) {
  const std::string file(where);
  DCR_EXPECTS(!json.empty() && json.front() == '{', errc::corrupt_payload,
              file + " is not a safetensors file: its JSON header does not start with '{'");
  // The JSON parser ends its input at a NUL byte, so bytes after one would go unread; the format
  // pads only with trailing spaces, and JSON itself has no place for a raw NUL.
  if (const auto nul = json.find('\0'); nul != std::string_view::npos)
    throw error(errc::corrupt_payload,
                file + ": NUL byte at byte " + std::to_string(nul) + " of the " +
                    std::to_string(json.size()) +
                    "-byte JSON header (file offset " + std::to_string(8 + nul) +
                    "); a header may be padded only with trailing spaces");
  // Top-level duplicates: parse keeps the last; count the keys of the top object separately.
  std::vector<std::string> top_keys;
  std::optional<std::string> nested_duplicate;
  nlohmann::json doc;
  {
    std::size_t depth = 0;
    std::vector<std::vector<std::string>> nested;
    auto callback = [&](int /*d*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using ev = nlohmann::json::parse_event_t;
      if (event == ev::object_start) {
        ++depth;
        if (depth > 1) nested.emplace_back();
      } else if (event == ev::object_end) {
        if (depth > 1 && !nested.empty()) nested.pop_back();
        if (depth > 0) --depth;
      } else if (event == ev::key && parsed.is_string()) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (depth == 1) {
          top_keys.push_back(k);
        } else if (!nested.empty()) {
          for (const auto& seen : nested.back())
            if (seen == k && !nested_duplicate) nested_duplicate = k;
          nested.back().push_back(k);
        }
      }
      return true;
    };
    try {
      doc = nlohmann::json::parse(json.begin(), json.end(), callback);
    } catch (const nlohmann::json::exception& e) {
      throw error(errc::corrupt_payload, file + ": the JSON header is malformed: " + e.what());
    }
  }
  DCR_EXPECTS(doc.is_object(), errc::corrupt_payload,
              file + ": the JSON header is not an object");
  DCR_EXPECTS(!nested_duplicate, errc::corrupt_payload,
              file + ": duplicate key " + detail::quoted(nested_duplicate.value_or("")) +
                  " in the JSON header");
  if (top_keys.size() != doc.size()) {
    std::sort(top_keys.begin(), top_keys.end());
    auto dup = std::adjacent_find(top_keys.begin(), top_keys.end());
    throw error(errc::corrupt_payload,
                file + ": the JSON header names " +
                    detail::quoted(dup != top_keys.end() ? *dup : std::string("?")) + " twice");
  }

  std::optional<safetensors_metadata> metadata;
  std::vector<safetensors_entry> tensors;
  tensors.reserve(doc.size());
  std::uint64_t needed = 0;  // bytes of data buffer the tensors' offsets reach
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      DCR_EXPECTS(v.is_object(), errc::corrupt_payload,
                  file + ": \"__metadata__\" is not an object");
      safetensors_metadata m;
      for (auto kv = v.begin(); kv != v.end(); ++kv) {
        DCR_EXPECTS(kv.value().is_string(), errc::corrupt_payload,
                    file + ": \"__metadata__\" value of " + detail::quoted(kv.key()) +
                        " is not a string");
        m.emplace(kv.key(), kv.value().get<std::string>());
      }
      metadata = std::move(m);
      continue;
    }
    const std::string at = file + ": tensor " + detail::quoted(name);
    DCR_EXPECTS(!name.empty(), errc::corrupt_payload, file + ": a tensor has an empty name");
    DCR_EXPECTS(v.is_object(), errc::corrupt_payload, at + ": entry is not an object");
    for (auto kv = v.begin(); kv != v.end(); ++kv)
      DCR_EXPECTS(kv.key() == "dtype" || kv.key() == "shape" || kv.key() == "data_offsets",
                  errc::corrupt_payload, at + ": unknown field " + detail::quoted(kv.key()));
    DCR_EXPECTS(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                errc::corrupt_payload,
                at + ": entry lacks one of \"dtype\", \"shape\", \"data_offsets\"");
    const auto& dt = v["dtype"];
    DCR_EXPECTS(dt.is_string(), errc::corrupt_payload, at + ": \"dtype\" is not a string");
    const auto type = parse_dtype(dt.get_ref<const std::string&>());
    DCR_EXPECTS(type.has_value(), errc::unsupported_version,
                at + ": unknown dtype " + detail::quoted(dt.get_ref<const std::string&>()));

    safetensors_entry e;
    e.name = name;
    e.type = *type;
    const auto& shape = v["shape"];
    DCR_EXPECTS(shape.is_array(), errc::corrupt_payload, at + ": \"shape\" is not an array");
    for (const auto& d : shape) {
      bool ok = true;
      const std::uint64_t extent = detail::json_u64(d, ok);
      DCR_EXPECTS(ok, errc::corrupt_payload,
                  at + ": \"shape\" holds " + d.dump() + ", not a non-negative integer");
      DCR_EXPECTS(extent <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                  errc::overflow, at + ": extent " + std::to_string(extent) + " is too large");
      e.shape.push_back(static_cast<std::int64_t>(extent));
    }
    // A zero extent makes the count 0 whatever the other extents are (checked_numel).
    const std::uint64_t word = dtype_size(e.type);
    const auto numel = checked_numel(
        e.shape, std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(word));
    DCR_EXPECTS(numel.has_value(), errc::overflow,
                at + ": the element count of its shape " + shape_string(e.shape) + " overflows");

    const auto& offsets = v["data_offsets"];
    DCR_EXPECTS(offsets.is_array() && offsets.size() == 2, errc::corrupt_payload,
                at + ": \"data_offsets\" is not an array of two integers");
    bool ok = true;
    e.begin = detail::json_u64(offsets[0], ok);
    e.end = detail::json_u64(offsets[1], ok);
    DCR_EXPECTS(ok, errc::corrupt_payload,
                at + ": \"data_offsets\" " + offsets.dump() + " are not non-negative integers");
    DCR_EXPECTS(e.begin <= e.end, errc::corrupt_payload,
                at + ": \"data_offsets\" " + offsets.dump() + " begin after they end");
    needed = std::max(needed, e.end);
    DCR_EXPECTS(e.end - e.begin == *numel * word, errc::shape_mismatch,
                at + ": " + std::to_string(e.end - e.begin) + " bytes, but " +
                    std::to_string(*numel) + " elements of " + std::string(dtype_name(e.type)) +
                    " take " + std::to_string(*numel * word));
    tensors.push_back(std::move(e));
  }

  // Offsets beyond the buffer: the file ends early (checked once all offsets are known, so the
  // message gives the size the header implies).
  DCR_EXPECTS(needed <= buffer_size, errc::truncated_payload,
              file + " is truncated: its header says " + std::to_string(needed) +
                  " bytes of tensor data follow the " + std::to_string(8 + json.size()) +
                  "-byte header, the file has " + std::to_string(buffer_size));
  // In offset order the tensors must tile the buffer: each begins where the previous ended.
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.begin < at)
      throw error(errc::corrupt_payload, file + ": tensor " + detail::quoted(t.name) +
                                             " (bytes " + std::to_string(t.begin) + ".." +
                                             std::to_string(t.end) + ") overlaps tensor " +
                                             detail::quoted(tensors[i - 1].name));
    if (t.begin > at)
      throw error(errc::corrupt_payload,
                  file + ": data bytes " + std::to_string(at) + ".." + std::to_string(t.begin) +
                      " before tensor " + detail::quoted(t.name) + " belong to no tensor");
    at = t.end;
  }
  DCR_EXPECTS(at == buffer_size, errc::corrupt_payload,
              file + ": data bytes " + std::to_string(at) + ".." + std::to_string(buffer_size) +
                  " after the last tensor belong to no tensor");
  return safetensors_header(json.size(), buffer_size, std::move(tensors), std::move(metadata));
}

inline safetensors_header parse_safetensors(std::span<const std::byte> file_bytes,
                                            std::string_view where) {
  const std::string file(where);
  DCR_EXPECTS(file_bytes.size() >= 8, errc::truncated_payload,
              file + " is not a safetensors file: " + std::to_string(file_bytes.size()) +
                  " bytes, shorter than the 8-byte header length");
  const auto n = dcr::detail::load_le<std::uint64_t>(file_bytes.data());
  DCR_EXPECTS(n <= safetensors_max_header_size, errc::overflow,
              file + " is not a safetensors file: its first 8 bytes " +
                  detail::printable(file_bytes.first(8)) + " read as a header length of " +
                  std::to_string(n) + " bytes, beyond the format's limit of " +
                  std::to_string(safetensors_max_header_size));
  DCR_EXPECTS(n <= file_bytes.size() - 8, errc::truncated_payload,
              file + " is truncated: its header length says " + std::to_string(n) +
                  " bytes of JSON, the file has " + std::to_string(file_bytes.size() - 8) +
                  " after the length");
  const std::string_view json(reinterpret_cast<const char*>(file_bytes.data() + 8),
                              static_cast<std::size_t>(n));
  return parse_safetensors_header(json, file_bytes.size() - 8 - n, where);
}

inline std::string make_safetensors_header(
    std::span<const safetensors_tensor> tensors,
    const std::optional<safetensors_metadata>& metadata) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (metadata) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : *metadata) m[k] = v;
    doc["__metadata__"] = std::move(m);
  }
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    const std::string where = "safetensors writer: tensor '" + t.name + "'";
    DCR_EXPECTS(!t.name.empty() && t.name != "__metadata__", errc::invalid_argument,
                "safetensors writer: invalid tensor name '" + t.name + "'");
    DCR_EXPECTS(!doc.contains(t.name), errc::invalid_argument, where + " appears twice");
    const auto numel = static_cast<std::uint64_t>(expect_numel(t.shape, dtype_size(t.type), where));
    DCR_EXPECTS(t.data.size() == numel * dtype_size(t.type), errc::shape_mismatch,
                where + ": " + std::to_string(t.data.size()) + " bytes for " +
                    std::to_string(numel) + " elements of " + std::string(dtype_name(t.type)));
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(dtype_name(t.type));
    e["shape"] = t.shape;
    e["data_offsets"] = {at, at + t.data.size()};
    doc[t.name] = std::move(e);
    at += t.data.size();
  }
  std::string json;
  try {
    json = doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::invalid_argument,
                std::string("safetensors writer: a name or metadata string is not UTF-8: ") +
                    e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  return json;
}

inline std::vector<std::byte> serialize_safetensors(
    std::span<const safetensors_tensor> tensors,
    const std::optional<safetensors_metadata>& metadata) {
  const std::string json = make_safetensors_header(tensors, metadata);
  std::size_t total = 8 + json.size();
  for (const auto& t : tensors) total += t.data.size();
  std::vector<std::byte> out(total);
  dcr::detail::store_le<std::uint64_t>(out.data(), json.size());
  std::memcpy(out.data() + 8, json.data(), json.size());
  std::size_t at = 8 + json.size();
  for (const auto& t : tensors) {
    if (!t.data.empty()) std::memcpy(out.data() + at, t.data.data(), t.data.size());
    at += t.data.size();
  }
  return out;
}

}  // namespace dcr::io
