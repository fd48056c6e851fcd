// dcr/detail/protocol/payload_store.inl: the bodies of dcr/protocol/payload_store.hpp (included at
// its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace dcr {

DCR_INLINE void memory_payload_store::put(const payload_id& id, std::span<const std::byte> bytes) {
  std::lock_guard lock(mutex_);
  auto [it, inserted] = objects_.try_emplace(id, bytes.begin(), bytes.end());
  DCR_EXPECTS(
      inserted || std::equal(bytes.begin(), bytes.end(), it->second.begin(), it->second.end()),
      errc::transport_failure,
      "memory_payload_store: payload (owner " + std::to_string(id.owner) + ", sequence " +
          std::to_string(id.sequence) + ") put again with other bytes");
  if (inserted) bytes_put_ += bytes.size();
}

DCR_INLINE void memory_payload_store::put_manifest(const attempt_key& key, std::uint32_t owner,
                                                   std::span<const payload_id> ids) {
  std::lock_guard lock(mutex_);
  std::vector<payload_id> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  owner_listing manifest{owner, {}, true, {}};
  for (const auto& id : sorted) {
    const auto it = objects_.find(id);
    DCR_EXPECTS(it != objects_.end() && id.attempt == key && id.owner == owner,
                errc::transport_failure,
                "memory_payload_store: manifest of owner " + std::to_string(owner) +
                    " lists a payload that was not put for its attempt");
    manifest.ids.push_back(id);
    manifest.sizes.push_back(it->second.size());
  }
  manifests_[key][owner] = std::move(manifest);
}

DCR_INLINE std::vector<owner_listing> memory_payload_store::list(const attempt_key& key) const {
  std::lock_guard lock(mutex_);
  std::map<std::uint32_t, owner_listing> by_owner;
  for (auto it = objects_.lower_bound(payload_id{key, 0, 0});
       it != objects_.end() && it->first.attempt == key; ++it) {
    auto& l = by_owner[it->first.owner];
    l.owner = it->first.owner;
    l.ids.push_back(it->first);
  }
  if (auto m = manifests_.find(key); m != manifests_.end())
    for (const auto& [owner, manifest] : m->second) by_owner[owner] = manifest;
  std::vector<owner_listing> out;
  for (auto& [owner, l] : by_owner) out.push_back(std::move(l));
  return out;
}

DCR_INLINE get_status memory_payload_store::get(const payload_id& id,
                                                std::vector<std::byte>& out) const {
  std::lock_guard lock(mutex_);
  auto it = objects_.find(id);
  if (it == objects_.end()) return get_status::absent;
  out.assign(it->second.begin(), it->second.end());
  return get_status::found;
}

DCR_INLINE void memory_payload_store::erase_through(std::uint64_t version) {
  std::lock_guard lock(mutex_);
  std::erase_if(objects_,
                [&](const auto& kv) { return kv.first.attempt.target_version <= version; });
  std::erase_if(manifests_, [&](const auto& kv) { return kv.first.target_version <= version; });
}

DCR_INLINE std::uint64_t memory_payload_store::bytes_put() const {
  std::lock_guard lock(mutex_);
  return bytes_put_;
}

DCR_INLINE std::size_t memory_payload_store::object_count() const {
  std::lock_guard lock(mutex_);
  return objects_.size();
}

DCR_INLINE file_payload_store::file_payload_store(std::filesystem::path dir)
    : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  DCR_EXPECTS(!ec, errc::transport_failure,
              "file_payload_store: cannot create '" + dir_.string() + "': " + ec.message());
}

DCR_INLINE void file_payload_store::put(const payload_id& id, std::span<const std::byte> bytes) {
  const auto path = payload_path(id);
  guarded(path, [&] {
    std::filesystem::create_directories(path.parent_path());
    if (io::path_exists(path)) {
      std::vector<std::byte> have;
      read_file(path, have);
      DCR_EXPECTS(std::equal(bytes.begin(), bytes.end(), have.begin(), have.end()),
                  errc::transport_failure,
                  "file_payload_store: '" + path.string() + "' put again with other bytes");
      return;
    }
    io::atomic_file f(path);
    f.write_at(bytes, 0);
    f.commit();
  });
}

DCR_INLINE void file_payload_store::put_manifest(const attempt_key& key, std::uint32_t owner,
                                                 std::span<const payload_id> ids) {
  const auto path = attempt_dir(key) / ("o" + std::to_string(owner)) / "manifest";
  guarded(path, [&] {
    std::vector<std::uint64_t> sizes;
    for (const auto& id : ids) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(payload_path(id), ec);
      DCR_EXPECTS(id.attempt == key && id.owner == owner && !ec, errc::transport_failure,
                  "file_payload_store: manifest '" + path.string() +
                      "' lists a payload that was not put for its attempt");
      sizes.push_back(size);
    }
    const std::string text = detail::manifest_text(ids, sizes);
    std::filesystem::create_directories(path.parent_path());
    io::atomic_file f(path);
    f.write_at(std::as_bytes(std::span(text)), 0);
    f.commit();
  });
}

DCR_INLINE std::vector<owner_listing> file_payload_store::list(const attempt_key& key) const {
  const auto dir = attempt_dir(key);
  std::vector<owner_listing> out;
  guarded(dir, [&] {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) return;
    for (const auto& o : std::filesystem::directory_iterator(dir)) {
      // Only the names this store writes ("o<owner>", "p<sequence>"); anything else in the
      // directory (temporaries start with '.') is not a payload.
      const auto owner = detail::parse_number(o.path().filename().string(), "o", UINT32_MAX);
      if (!owner) continue;
      owner_listing l;
      l.owner = static_cast<std::uint32_t>(*owner);
      const auto manifest = o.path() / "manifest";
      if (io::path_exists(manifest)) {
        std::vector<std::byte> raw;
        read_file(manifest, raw);
        l = detail::parse_manifest(
            std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), key, l.owner,
            "file_payload_store: manifest '" + manifest.string() + "'");
      } else {
        for (const auto& p : std::filesystem::directory_iterator(o.path())) {
          const auto seq = detail::parse_number(p.path().filename().string(), "p", UINT32_MAX);
          if (seq) l.ids.push_back(payload_id{key, l.owner, static_cast<std::uint32_t>(*seq)});
        }
      }
      if (!l.complete) std::sort(l.ids.begin(), l.ids.end());  // a manifest's come sorted
      out.push_back(std::move(l));
    }
  });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.owner < b.owner; });
  return out;
}

DCR_INLINE get_status file_payload_store::get(const payload_id& id,
                                              std::vector<std::byte>& out) const {
  const auto path = payload_path(id);
  get_status status = get_status::absent;
  guarded(path, [&] {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return;  // not put yet, or erased
    if (fd < 0) io::throw_io_error("cannot open", path, errno);
    read_all(io::file_descriptor(fd), path, out);
    status = get_status::found;
  });
  return status;
}

DCR_INLINE void file_payload_store::erase_through(std::uint64_t version) {
  guarded(dir_, [&] {
    for (const auto& t : std::filesystem::directory_iterator(dir_)) {
      const auto key = parse_attempt_key(t.path().filename().string());
      if (key && key->target_version <= version) std::filesystem::remove_all(t.path());
    }
  });
}

DCR_INLINE std::filesystem::path file_payload_store::attempt_dir(const attempt_key& key) const {
  return dir_ / to_string(key);
}

DCR_INLINE std::filesystem::path file_payload_store::payload_path(const payload_id& id) const {
  return attempt_dir(id.attempt) / ("o" + std::to_string(id.owner)) /
         ("p" + std::to_string(id.sequence));
}

DCR_INLINE void file_payload_store::read_all(const io::file_descriptor& fd,
                                             const std::filesystem::path& path,
                                             std::vector<std::byte>& out) {
  out.resize(static_cast<std::size_t>(io::file_size(fd.get(), path)));
  std::size_t done = 0;
  while (done < out.size()) {
    const auto n =
        ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io::throw_io_error("cannot read", path, n < 0 ? errno : EIO);
    done += static_cast<std::size_t>(n);
  }
}

DCR_INLINE void file_payload_store::read_file(const std::filesystem::path& path,
                                              std::vector<std::byte>& out) {
  read_all(io::file_descriptor::open(path, O_RDONLY), path, out);
}

}  // namespace dcr

namespace dcr::detail {

DCR_INLINE std::string manifest_text(std::span<const payload_id> ids,
                                     std::span<const std::uint64_t> sizes) {
  DCR_EXPECTS(ids.size() == sizes.size(), errc::invalid_argument,
              "manifest_text: " + std::to_string(ids.size()) + " ids but " +
                  std::to_string(sizes.size()) + " sizes");
  std::string text = "dcr-manifest 2 " + std::to_string(ids.size()) + "\n";
  for (std::size_t i = 0; i < ids.size(); ++i)
    text += std::to_string(ids[i].sequence) + " " + std::to_string(sizes[i]) + "\n";
  return text;
}

DCR_INLINE owner_listing parse_manifest(std::string_view text, const attempt_key& key,
                                        std::uint32_t owner, const std::string& where) {
  const auto damaged = [&](const std::string& why) -> owner_listing {
    throw error(errc::transport_failure, where + " is damaged: " + why);
  };
  constexpr std::string_view magic_sizes = "dcr-manifest 2 ", magic_ids = "dcr-manifest 1 ";
  const bool with_sizes = text.starts_with(magic_sizes);
  const auto first = text.find('\n');
  if ((!with_sizes && !text.starts_with(magic_ids)) || first == std::string_view::npos)
    return damaged("no header");
  const std::size_t header = magic_sizes.size();  // both magics have this length
  const auto count = parse_number(text.substr(header, first - header), "", UINT32_MAX);
  if (!count) return damaged("bad count");
  std::vector<std::pair<std::uint32_t, std::uint64_t>> lines;  // sequence, bytes
  for (std::size_t at = first + 1; at < text.size();) {
    const auto nl = text.find('\n', at);
    if (nl == std::string_view::npos) return damaged("unterminated line");
    const std::string_view line = text.substr(at, nl - at);
    const auto space = with_sizes ? line.find(' ') : std::string_view::npos;
    if (with_sizes && space == std::string_view::npos)
      return damaged("line '" + std::string(line) + "' has no size");
    const auto seq = parse_number(line.substr(0, space), "", UINT32_MAX);
    if (!seq) return damaged("bad sequence number in line '" + std::string(line) + "'");
    std::uint64_t bytes = 0;
    if (with_sizes) {
      const auto size = parse_number(line.substr(space + 1), "", UINT64_MAX);
      if (!size) return damaged("bad size in line '" + std::string(line) + "'");
      bytes = *size;
    }
    lines.emplace_back(static_cast<std::uint32_t>(*seq), bytes);
    at = nl + 1;
  }
  if (lines.size() != *count)
    return damaged("lists " + std::to_string(lines.size()) + " payloads, its header " +
                   std::to_string(*count));
  std::sort(lines.begin(), lines.end());
  for (std::size_t i = 1; i < lines.size(); ++i)
    if (lines[i].first == lines[i - 1].first)
      return damaged("lists sequence " + std::to_string(lines[i].first) + " twice");
  owner_listing out;
  out.owner = owner;
  out.complete = true;
  for (const auto& [seq, bytes] : lines) {
    out.ids.push_back(payload_id{key, owner, seq});
    if (with_sizes) out.sizes.push_back(bytes);
  }
  return out;
}

}  // namespace dcr::detail

#endif  // DCR_HEADER_BODIES
