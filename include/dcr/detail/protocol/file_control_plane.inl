// dcr/detail/protocol/file_control_plane.inl: the bodies of dcr/protocol/file_control_plane.hpp
// (included at its end).
#pragma once

#if DCR_HEADER_BODIES

namespace dcr {

DCR_INLINE void file_control_plane::create(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir / "records", ec);
  std::filesystem::create_directories(dir / "leases", ec);
  if (ec) unavailable(dir, "create", dir.string(), ec.message());
  if (!io::path_exists(dir / "dcr-control-plane")) {
    io::atomic_file marker(dir / "dcr-control-plane");
    const std::string text = "dcr file control plane 1\n";
    marker.write_at(std::as_bytes(std::span(text)), 0);
    marker.commit();
  }
}

DCR_INLINE file_control_plane::file_control_plane(std::filesystem::path dir,
                                                  std::chrono::milliseconds poll_interval)
    : dir_(std::move(dir)), poll_(poll_interval) {
  check_marker("open");
}

DCR_INLINE std::optional<control_record> file_control_plane::get(const std::string& key) {
  return guarded("get", key, [&] {
    auto lock = take_lock(LOCK_SH, "get", key);
    if (io::path_exists(dir_ / "journal")) {  // a writer died mid-transaction: roll forward
      lock.reset();  // flock locks belong to the open file: drop the shared one first
      lock = take_lock(LOCK_EX, "get", key);
      replay_journal();
    }
    auto r = read_record(key);
    if (r && r->lease != 0 && lease_expired(r->lease)) r.reset();
    check_marker("get", key);  // "absent" read from a directory that vanished meanwhile
    return r;
  });
}

DCR_INLINE std::vector<control_record> file_control_plane::list(const std::string& prefix) {
  return guarded("list", prefix, [&] {
    auto lock = take_lock(LOCK_SH, "list", prefix);
    if (io::path_exists(dir_ / "journal")) {
      lock.reset();
      lock = take_lock(LOCK_EX, "list", prefix);
      replay_journal();
    }
    std::vector<control_record> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ / "records")) {
      const auto name = entry.path().filename().string();
      if (!name.empty() && name[0] == '.') continue;  // a temporary
      const auto key = decode_key(name);
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
      auto r = read_record(key);
      if (r && (r->lease == 0 || !lease_expired(r->lease))) out.push_back(std::move(*r));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    check_marker("list", prefix);
    return out;
  });
}

DCR_INLINE bool file_control_plane::transact(std::span<const key_compare> compares,
                                             std::span<const key_write> writes) {
  const std::string what = writes.empty() ? std::string("-") : writes.front().key;
  return guarded("transact", what, [&] {
    auto lock = take_lock(LOCK_EX, "transact", what);
    replay_journal();
    collect_expired_leases();
    for (const auto& c : compares) {
      auto r = read_record(c.key);
      if (r && r->lease != 0 && lease_expired(r->lease)) r.reset();
      if ((r ? r->revision : 0) != c.revision) {
        check_marker("transact", c.key);  // a failed compare must not come from a vanished store
        return false;
      }
    }
    for (const auto& w : writes)
      DCR_EXPECTS(w.erase || w.lease == 0 || !lease_expired(w.lease), errc::invalid_argument,
                  "file_control_plane: write of '" + w.key + "' under expired or unknown lease " +
                      std::to_string(w.lease));
    if (!writes.empty()) apply(read_revision() + 1, writes);
    return true;
  });
}

DCR_INLINE std::int64_t file_control_plane::revision() {
  return guarded("revision", "-", [&] {
    auto lock = take_lock(LOCK_SH, "revision", "-");
    const auto r = read_revision();
    check_marker("revision");
    return r;
  });
}

DCR_INLINE std::int64_t file_control_plane::wait_for_change(const std::string& prefix,
                                                            std::int64_t after,
                                                            protocol_clock::time_point deadline) {
  for (;;) {
    const std::int64_t now_rev = guarded("wait", prefix, [&] {
      auto lock = take_lock(LOCK_EX, "wait", prefix);
      replay_journal();
      collect_expired_leases();
      const auto r = read_revision();
      check_marker("wait", prefix);
      return r;
    });
    if (now_rev > after || protocol_clock::now() >= deadline) return now_rev;
    std::this_thread::sleep_for(std::min<protocol_clock::duration>(
        poll_, std::max<protocol_clock::duration>(deadline - protocol_clock::now(),
                                                  protocol_clock::duration::zero())));
  }
}

DCR_INLINE lease_id file_control_plane::grant_lease(std::chrono::seconds ttl) {
  return guarded("grant_lease", "-", [&] {
    auto lock = take_lock(LOCK_EX, "grant_lease", "-");
    lease_id id = 1;
    const auto counter = dir_ / "next-lease";
    if (io::path_exists(counter)) id = std::stoll(read_small(counter)) + 1;
    write_small(counter, std::to_string(id));
    write_lease(id, ttl);
    return id;
  });
}

DCR_INLINE bool file_control_plane::keep_alive(lease_id lease) {
  return guarded("keep_alive", std::to_string(lease), [&] {
    auto lock = take_lock(LOCK_EX, "keep_alive", std::to_string(lease));
    collect_expired_leases();
    const auto path = lease_path(lease);
    if (!io::path_exists(path)) return false;
    std::istringstream in(read_small(path));
    std::int64_t expiry = 0, ttl = 0;
    in >> expiry >> ttl;
    write_lease(lease, std::chrono::seconds(ttl));
    return true;
  });
}

DCR_INLINE void file_control_plane::revoke(lease_id lease) {
  guarded("revoke", std::to_string(lease), [&] {
    auto lock = take_lock(LOCK_EX, "revoke", std::to_string(lease));
    replay_journal();
    drop_lease(lease);
    return 0;
  });
}

DCR_INLINE void file_control_plane::unavailable(const std::filesystem::path& dir,
                                                std::string_view op, const std::string& key,
                                                const std::string& why) {
  throw error(errc::control_plane_unavailable, "file control plane '" + dir.string() + "': " +
                                                   std::string(op) + " '" + key + "': " + why);
}

DCR_INLINE void file_control_plane::check_marker(std::string_view op,
                                                 const std::string& key) const {
  if (!io::path_exists(dir_ / "dcr-control-plane"))
    unavailable(dir_, op, key, "not a dcr control-plane directory (or not reachable)");
}

DCR_INLINE io::file_descriptor file_control_plane::take_lock(int mode, std::string_view op,
                                                             const std::string& key) const {
  check_marker(op, key);
  auto fd = io::file_descriptor::open(dir_ / "lock", O_RDWR | O_CREAT);
  while (::flock(fd.get(), mode) != 0) {
    if (errno != EINTR) unavailable(dir_, op, key, std::strerror(errno));
  }
  return fd;
}

DCR_INLINE std::string file_control_plane::encode_key(const std::string& key) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && !out.empty())) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out.empty() ? std::string("%") : out;
}

DCR_INLINE std::string file_control_plane::decode_key(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%' && i + 2 < name.size()) {
      out += static_cast<char>(std::stoi(name.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else if (name[i] != '%') {
      out += name[i];
    }
  }
  return out;
}

DCR_INLINE std::filesystem::path file_control_plane::record_path(const std::string& key) const {
  return dir_ / "records" / encode_key(key);
}

DCR_INLINE std::filesystem::path file_control_plane::lease_path(lease_id id) const {
  return dir_ / "leases" / std::to_string(id);
}

DCR_INLINE std::string file_control_plane::read_small(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) io::throw_io_error("cannot read", path, errno ? errno : ENOENT);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

DCR_INLINE void file_control_plane::write_small(const std::filesystem::path& path,
                                                const std::string& text) {
  io::atomic_file f(path);
  f.write_at(std::as_bytes(std::span(text)), 0);
  f.commit();
}

DCR_INLINE std::optional<control_record> file_control_plane::read_record(
    const std::string& key) const {
  const auto path = record_path(key);
  if (!io::path_exists(path)) return std::nullopt;
  const std::string text = read_small(path);
  const auto nl = text.find('\n');
  std::istringstream head(text.substr(0, nl == std::string::npos ? 0 : nl));
  std::string magic, digest;
  control_record r;
  std::uint64_t length = 0;
  head >> magic >> r.revision >> r.lease >> length >> digest;
  const bool ok = nl != std::string::npos && magic == "dcrrec1" && text.size() - nl - 1 == length;
  if (!ok) io::throw_io_error("damaged record", path, EIO);
  r.key = key;
  r.value = text.substr(nl + 1);
  char expect[17];
  std::snprintf(expect, sizeof expect, "%016llx",
                static_cast<unsigned long long>(XXH64(r.value.data(), r.value.size(), 0)));
  if (digest != expect) io::throw_io_error("damaged record (checksum)", path, EIO);
  return r;
}

DCR_INLINE std::int64_t file_control_plane::read_revision() const {
  const auto path = dir_ / "revision";
  return io::path_exists(path) ? std::stoll(read_small(path)) : 0;
}

DCR_INLINE void file_control_plane::apply(std::int64_t rev, std::span<const key_write> writes) {
  std::string j = "dcrtxn1 " + std::to_string(rev) + " " + std::to_string(writes.size()) + "\n";
  for (const auto& w : writes) {
    j += std::to_string(w.erase ? 1 : 0) + " " + std::to_string(w.lease) + " " +
         std::to_string(w.key.size()) + " " + std::to_string(w.value.size()) + "\n";
    j += w.key;
    j += w.value;
  }
  write_small(dir_ / "journal", j);  // the commit point
  replay_journal();
}

DCR_INLINE void file_control_plane::replay_journal() {
  const auto path = dir_ / "journal";
  if (!io::path_exists(path)) return;
  const std::string j = read_small(path);
  std::size_t at = j.find('\n');
  std::istringstream head(j.substr(0, at));
  std::string magic;
  std::int64_t rev = 0;
  std::size_t count = 0;
  head >> magic >> rev >> count;
  if (magic != "dcrtxn1" || at == std::string::npos)
    io::throw_io_error("damaged journal", path, EIO);
  ++at;
  for (std::size_t k = 0; k < count; ++k) {
    const auto nl = j.find('\n', at);
    if (nl == std::string::npos) io::throw_io_error("damaged journal", path, EIO);
    std::istringstream line(j.substr(at, nl - at));
    int erase_flag = 0;
    lease_id lease = 0;
    std::size_t klen = 0, vlen = 0;
    line >> erase_flag >> lease >> klen >> vlen;
    at = nl + 1;
    if (at + klen + vlen > j.size()) io::throw_io_error("damaged journal", path, EIO);
    const std::string key = j.substr(at, klen);
    const std::string value = j.substr(at + klen, vlen);
    at += klen + vlen;
    const auto rp = record_path(key);
    if (erase_flag) {
      ::unlink(rp.c_str());
    } else {
      char digest[17];
      std::snprintf(digest, sizeof digest, "%016llx",
                    static_cast<unsigned long long>(XXH64(value.data(), value.size(), 0)));
      write_small(rp, "dcrrec1 " + std::to_string(rev) + " " + std::to_string(lease) + " " +
                          std::to_string(value.size()) + " " + digest + "\n" + value);
    }
  }
  io::sync_directory(dir_ / "records");
  if (read_revision() < rev) write_small(dir_ / "revision", std::to_string(rev));
  io::remove_durably(path);
}

DCR_INLINE void file_control_plane::write_lease(lease_id id, std::chrono::seconds ttl) {
  const auto expiry = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          (std::chrono::system_clock::now() + ttl).time_since_epoch())
                          .count();
  write_small(lease_path(id), std::to_string(expiry) + " " + std::to_string(ttl.count()));
}

DCR_INLINE bool file_control_plane::lease_expired(lease_id id) const {
  const auto path = lease_path(id);
  if (!io::path_exists(path)) return true;
  std::istringstream in(read_small(path));
  std::int64_t expiry = 0;
  in >> expiry;
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return expiry <= now;
}

DCR_INLINE void file_control_plane::collect_expired_leases() {
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "leases")) {
    const auto name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    const lease_id id = std::stoll(name);
    if (lease_expired(id)) drop_lease(id);
  }
}

DCR_INLINE void file_control_plane::drop_lease(lease_id id) {
  std::vector<key_write> erases;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "records")) {
    const auto name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    const auto key = decode_key(name);
    if (auto r = read_record(key); r && r->lease == id) erases.push_back({key, {}, 0, true});
  }
  if (!erases.empty()) apply(read_revision() + 1, erases);
  io::remove_durably(lease_path(id));
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
