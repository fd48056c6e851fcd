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

}  // namespace dcr::io
