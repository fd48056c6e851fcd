// dcr/detail/protocol/plane/file_control_plane.inl: the bodies of dcr/protocol/plane/file_control_plane.hpp
// (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

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
    : dir_(std::move(dir)), poll_(poll_interval), foreign_(std::make_shared<foreign_files>()) {
  foreign_->sink = [](const std::filesystem::path& path, const std::string& why) {
    std::fprintf(stderr, "dcr: file control plane: skipping foreign file '%s': %s\n",
                 path.c_str(), why.c_str());
  };
  check_marker("open");
}

DCR_INLINE void file_control_plane::set_foreign_file_sink(foreign_file_sink sink) {
  std::lock_guard lock(foreign_->mutex);
  foreign_->sink = std::move(sink);
}

DCR_INLINE std::optional<control_record> file_control_plane::get(const std::string& key) {
  return guarded("get", key, [&] {
    auto lock = lock_to_read("get", key);
    auto r = read_record(key);
    if (r && r->lease != 0 && lease_expired(r->lease)) r.reset();
    check_marker("get", key);  // "absent" read from a directory that vanished meanwhile
    return r;
  });
}

DCR_INLINE std::vector<control_record> file_control_plane::list(const std::string& prefix) {
  return guarded("list", prefix, [&] {
    auto lock = lock_to_read("list", prefix);
    std::vector<control_record> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ / "records")) {
      std::string key;
      if (skip_entry(entry, false, key)) continue;
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
    auto lock = lock_to_write("transact", what);
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
    if (!writes.empty()) apply(writes);
    return true;
  });
}

DCR_INLINE std::int64_t file_control_plane::revision() {
  return guarded("revision", "-", [&] {
    auto lock = lock_to_read("revision", "-");
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
      auto lock = lock_to_write("wait", prefix);
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
    auto lock = lock_to_write("grant_lease", "-");
    const auto counter = dir_ / "next-lease";
    const lease_id id = read_counter(counter) + 1;
    write_small(counter, std::to_string(id));
    write_lease(id, ttl);
    return id;
  });
}

DCR_INLINE bool file_control_plane::keep_alive(lease_id lease) {
  return guarded("keep_alive", std::to_string(lease), [&] {
    auto lock = lock_to_write("keep_alive", std::to_string(lease));
    collect_expired_leases();
    const auto l = read_lease(lease);
    if (!l) return false;
    write_lease(lease, std::chrono::seconds(l->ttl_s));
    return true;
  });
}

DCR_INLINE void file_control_plane::revoke(lease_id lease) {
  guarded("revoke", std::to_string(lease), [&] {
    auto lock = lock_to_write("revoke", std::to_string(lease));
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

DCR_INLINE io::file_descriptor file_control_plane::lock_to_write(std::string_view op,
                                                                 const std::string& key) {
  auto lock = take_lock(LOCK_EX, op, key);
  replay_journal();
  return lock;
}

DCR_INLINE io::file_descriptor file_control_plane::lock_to_read(std::string_view op,
                                                                const std::string& key) {
  auto lock = take_lock(LOCK_SH, op, key);
  if (io::path_exists(dir_ / "journal")) {  // a writer died mid-transaction: roll forward
    lock.reset();  // flock locks belong to the open file: drop the shared one first
    lock = lock_to_write(op, key);
  }
  return lock;
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

DCR_INLINE std::optional<std::string> file_control_plane::decode_key(const std::string& name) {
  if (name == "%") return std::string();
  std::string out;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;  // lower case is not what encode_key writes
  };
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out += name[i];
      continue;
    }
    if (i + 2 >= name.size()) return std::nullopt;
    const int hi = nibble(name[i + 1]), lo = nibble(name[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  // Only the one spelling encode_key writes (so that two names never hold one key).
  if (out.empty() || encode_key(out) != name) return std::nullopt;
  return out;
}

DCR_INLINE std::optional<lease_id> file_control_plane::decode_lease(const std::string& name) {
  const auto id = detail::parse_number(name, "", static_cast<std::uint64_t>(INT64_MAX));
  if (!id || *id == 0) return std::nullopt;
  return static_cast<lease_id>(*id);
}

DCR_INLINE bool file_control_plane::skip_entry(const std::filesystem::directory_entry& entry,
                                               bool lease_dir, std::string& name) const {
  const auto file = entry.path().filename().string();
  if (file.empty() || file[0] == '.') return true;  // a temporary
  if (!entry.is_regular_file() || entry.is_symlink()) {
    report_foreign(entry.path(), "not a regular file");
    return true;
  }
  if (lease_dir) {
    if (!decode_lease(file)) {
      report_foreign(entry.path(), "not a lease id (a positive decimal below 2^63)");
      return true;
    }
    name = file;
    return false;
  }
  auto key = decode_key(file);
  if (!key) {
    report_foreign(entry.path(), "not a file name the control plane writes for a key");
    return true;
  }
  name = std::move(*key);
  return false;
}

DCR_INLINE void file_control_plane::report_foreign(const std::filesystem::path& path,
                                                   const std::string& why) const {
  std::lock_guard lock(foreign_->mutex);
  if (!foreign_->reported.insert(path.string()).second || !foreign_->sink) return;
  foreign_->sink(path, why);
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
  if (in.bad()) io::throw_io_error("cannot read", path, EIO);
  return s.str();
}

DCR_INLINE void file_control_plane::write_small(const std::filesystem::path& path,
                                                const std::string& text) const {
  // One fixed temporary per file: writers hold the exclusive lock, so none races another
  // here, and a crashed writer's leftover is truncated by the next instead of piling up.
  const auto temp = io::hidden_sibling(path, ".tmp");
  try {
    step("write", temp);
    auto fd = io::file_descriptor::open(temp, O_WRONLY | O_CREAT | O_TRUNC);
    io::write_all_at(fd.get(), std::as_bytes(std::span(text)), 0, temp);
    step("fsync", temp);
    io::sync_file(fd.get(), temp);
    fd.reset();
    step("rename", path);
    if (::rename(temp.c_str(), path.c_str()) != 0)
      io::throw_io_error("cannot rename to '" + path.string() + "' the file", temp, errno);
  } catch (...) {
    ::unlink(temp.c_str());  // what a failed step leaves (a crash leaves it for the next one)
    throw;
  }
  sync_dir(io::parent_directory(path));
}

DCR_INLINE void file_control_plane::remove_small(const std::filesystem::path& path) const {
  step("unlink", path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) io::throw_io_error("cannot remove", path, errno);
  sync_dir(io::parent_directory(path));
}

DCR_INLINE void file_control_plane::sync_dir(const std::filesystem::path& dir) const {
  step("fsync", dir);
  io::sync_directory(dir);
}

DCR_INLINE std::int64_t file_control_plane::read_counter(const std::filesystem::path& path) {
  if (!io::path_exists(path)) return 0;
  const auto n = detail::parse_number(read_small(path), "", static_cast<std::uint64_t>(INT64_MAX));
  if (!n) io::throw_io_error("damaged counter file (not a decimal)", path, EIO);
  return static_cast<std::int64_t>(*n);
}

namespace detail {
/// The fields of `line`, separated by single spaces.
inline std::vector<std::string_view> control_plane_fields(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto sp = line.find(' ');
    out.push_back(line.substr(0, sp));
    if (sp == std::string_view::npos) return out;
    line.remove_prefix(sp + 1);
  }
}
}  // namespace detail

DCR_INLINE std::optional<control_record> file_control_plane::read_record(
    const std::string& key) const {
  const auto path = record_path(key);
  if (!io::path_exists(path)) return std::nullopt;
  const std::string text = read_small(path);
  const auto nl = text.find('\n');
  if (nl == std::string::npos) io::throw_io_error("damaged record (no header)", path, EIO);
  const auto f = detail::control_plane_fields(std::string_view(text).substr(0, nl));
  const auto number = [&](std::string_view field) {
    const auto v = detail::parse_number(field, "", static_cast<std::uint64_t>(INT64_MAX));
    if (!v) io::throw_io_error("damaged record (header)", path, EIO);
    return static_cast<std::int64_t>(*v);
  };
  if (f.size() != 5 || f[0] != "dcrrec1" || f[4].size() != 16)
    io::throw_io_error("damaged record (header)", path, EIO);
  control_record r;
  r.key = key;
  r.revision = number(f[1]);
  r.lease = number(f[2]);
  const auto length = static_cast<std::uint64_t>(number(f[3]));
  if (text.size() - nl - 1 != length) io::throw_io_error("damaged record (length)", path, EIO);
  r.value = text.substr(nl + 1);
  char expect[17];
  std::snprintf(expect, sizeof expect, "%016llx",
                static_cast<unsigned long long>(XXH64(r.value.data(), r.value.size(), 0)));
  if (f[4] != expect) io::throw_io_error("damaged record (checksum)", path, EIO);
  return r;
}

DCR_INLINE std::int64_t file_control_plane::read_revision() const {
  return read_counter(dir_ / "revision");
}

DCR_INLINE void file_control_plane::apply(std::span<const key_write> writes) {
  const auto path = dir_ / "journal";
  if (io::path_exists(path))  // an invariant of this file: lock_to_write replayed it
    io::throw_io_error("a journal is left over before a new transaction", path, EEXIST);
  const std::int64_t rev = read_revision() + 1;
  std::string j = "dcrtxn1 " + std::to_string(rev) + " " + std::to_string(writes.size()) + "\n";
  for (const auto& w : writes) {
    j += std::to_string(w.erase ? 1 : 0) + " " + std::to_string(w.lease) + " " +
         std::to_string(w.key.size()) + " " + std::to_string(w.value.size()) + "\n";
    j += w.key;
    j += w.value;
  }
  write_small(path, j);  // the commit point (its rename)
  replay_journal();
}

DCR_INLINE void file_control_plane::replay_journal() {
  const auto path = dir_ / "journal";
  if (!io::path_exists(path)) return;
  const std::string j = read_small(path);
  const auto damaged = [&](const char* what) {
    io::throw_io_error(std::string("damaged journal (") + what + ")", path, EIO);
  };
  const auto number = [&](std::string_view field, std::uint64_t limit) {
    const auto v = detail::parse_number(field, "", limit);
    if (!v) damaged("a field is not a decimal");
    return *v;
  };
  std::size_t at = j.find('\n');
  if (at == std::string::npos) damaged("no header");
  const auto head = detail::control_plane_fields(std::string_view(j).substr(0, at));
  if (head.size() != 3 || head[0] != "dcrtxn1") damaged("header");
  const auto rev = static_cast<std::int64_t>(number(head[1], INT64_MAX));
  const auto count = number(head[2], j.size());
  ++at;
  for (std::uint64_t k = 0; k < count; ++k) {
    const auto nl = j.find('\n', at);
    if (nl == std::string::npos) damaged("truncated");
    const auto f = detail::control_plane_fields(std::string_view(j).substr(at, nl - at));
    if (f.size() != 4) damaged("write header");
    const bool erase = number(f[0], 1) == 1;
    const auto lease = static_cast<lease_id>(number(f[1], INT64_MAX));
    const auto klen = number(f[2], j.size());
    const auto vlen = number(f[3], j.size());
    at = nl + 1;
    if (at + klen + vlen > j.size()) damaged("truncated");
    const std::string key = j.substr(at, klen);
    const std::string value = j.substr(at + klen, vlen);
    at += klen + vlen;
    const auto rp = record_path(key);
    if (erase) {
      step("unlink", rp);
      if (::unlink(rp.c_str()) != 0 && errno != ENOENT) io::throw_io_error("cannot remove", rp, errno);
    } else {
      char digest[17];
      std::snprintf(digest, sizeof digest, "%016llx",
                    static_cast<unsigned long long>(XXH64(value.data(), value.size(), 0)));
      write_small(rp, "dcrrec1 " + std::to_string(rev) + " " + std::to_string(lease) + " " +
                          std::to_string(value.size()) + " " + digest + "\n" + value);
    }
  }
  sync_dir(dir_ / "records");
  if (read_revision() < rev) write_small(dir_ / "revision", std::to_string(rev));
  remove_small(path);
}

DCR_INLINE void file_control_plane::write_lease(lease_id id, std::chrono::seconds ttl) {
  const auto expiry = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          (std::chrono::system_clock::now() + ttl).time_since_epoch())
                          .count();
  write_small(lease_path(id), std::to_string(expiry) + " " + std::to_string(ttl.count()));
}

DCR_INLINE std::optional<file_control_plane::lease_file> file_control_plane::read_lease(
    lease_id id) const {
  const auto path = lease_path(id);
  if (!io::path_exists(path)) return std::nullopt;
  const std::string text = read_small(path);
  const auto f = detail::control_plane_fields(text);
  const auto number = [&](std::string_view field) {
    const auto v = detail::parse_number(field, "", static_cast<std::uint64_t>(INT64_MAX));
    if (!v) io::throw_io_error("damaged lease file (not '<expiry ns> <ttl s>')", path, EIO);
    return static_cast<std::int64_t>(*v);
  };
  if (f.size() != 2) io::throw_io_error("damaged lease file (not '<expiry ns> <ttl s>')", path, EIO);
  return lease_file{number(f[0]), number(f[1])};
}

DCR_INLINE bool file_control_plane::lease_expired(lease_id id) const {
  const auto l = read_lease(id);
  if (!l) return true;
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return l->expiry_ns <= now;
}

DCR_INLINE void file_control_plane::collect_expired_leases() {
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "leases")) {
    std::string name;
    if (skip_entry(entry, true, name)) continue;
    const lease_id id = *decode_lease(name);
    if (lease_expired(id)) drop_lease(id);
  }
}

DCR_INLINE void file_control_plane::drop_lease(lease_id id) {
  std::vector<key_write> erases;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "records")) {
    std::string key;
    if (skip_entry(entry, false, key)) continue;
    if (auto r = read_record(key); r && r->lease == id) erases.push_back({key, {}, 0, true});
  }
  if (!erases.empty()) apply(erases);
  remove_small(lease_path(id));
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
