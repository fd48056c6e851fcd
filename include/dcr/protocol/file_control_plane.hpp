// dcr/protocol/file_control_plane.hpp: a control plane in a directory on a local or shared
// filesystem (the embedded default of `dcr simulate`). Survives a crash of any process at any
// point: a record is never torn, a transaction is never half applied.
//
// Layout of the directory DIR (made by create(); opening a directory without the marker is an
// error, so a store whose directory vanished is reported unavailable instead of silently
// recreated empty):
//   DIR/dcr-control-plane   marker
//   DIR/lock                flock(2): exclusive for writes, shared for reads
//   DIR/revision            the store revision (decimal)
//   DIR/journal             a transaction being applied (present only between steps 2 and 4)
//   DIR/records/<key>       one file per record: header (revision, lease, length, xxh64), value
//   DIR/leases/<id>         expiry time (system clock, nanoseconds) and ttl
// A transaction, under the exclusive lock: (1) replays a leftover journal, (2) checks its
// compares, writes the journal (temporary, fsync, rename, fsync of DIR: the commit point), (3)
// writes each record as temporary + fsync + rename, erases, writes the revision, fsyncs the
// directories, (4) removes the journal. A crash before the journal's rename loses the
// transaction whole; a crash after it is rolled forward by the next operation.
// Leases use the system clock, shared by processes on one machine (on a shared mount, the
// hosts' clocks must agree to well within a ttl). wait_for_change polls the revision file
// (every poll_interval) and collects expired leases. flock works on local filesystems and on
// NFSv4 (Linux maps it to byte-range locks).
// Every failure of the filesystem (directory gone, unwritable, I/O error) throws
// errc::control_plane_unavailable naming the directory, the operation and the key.
#pragma once
#include "dcr/config.hpp"
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dcr/error.hpp"
#include "dcr/io/file.hpp"
#include "dcr/protocol/control_plane.hpp"

namespace dcr {

class file_control_plane {
 public:
  using control_plane_concept = control_plane_tag;

  /// Makes `dir` (and its parents) a control-plane directory if it is not one yet.
  static void create(const std::filesystem::path& dir);

  /// Opens the control plane in `dir` (made by create()). Throws control_plane_unavailable if
  /// it is not one (or not reachable).
  explicit file_control_plane(std::filesystem::path dir,
                              std::chrono::milliseconds poll_interval = std::chrono::milliseconds(5));

  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  std::optional<control_record> get(const std::string& key);

  std::vector<control_record> list(const std::string& prefix);

  bool transact(std::span<const key_compare> compares, std::span<const key_write> writes);

  std::int64_t revision();

  std::int64_t wait_for_change(const std::string& prefix, std::int64_t after,
                               protocol_clock::time_point deadline);

  lease_id grant_lease(std::chrono::seconds ttl);

  bool keep_alive(lease_id lease);

  void revoke(lease_id lease);

 private:
  [[noreturn]] static void unavailable(const std::filesystem::path& dir, std::string_view op,
                                       const std::string& key, const std::string& why);

  // Runs `f`, turning filesystem failures into control_plane_unavailable with context.
  template <class F>
  auto guarded(std::string_view op, const std::string& key, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const error& e) {
      if (e.dcr_code() == errc::io_error) unavailable(dir_, op, key, e.what());
      throw;
    } catch (const std::filesystem::filesystem_error& e) {
      unavailable(dir_, op, key, e.code().message());
    } catch (const std::invalid_argument&) {
      unavailable(dir_, op, key, "damaged counter file");
    }
  }

  void check_marker(std::string_view op, const std::string& key = "-") const;

  io::file_descriptor take_lock(int mode, std::string_view op, const std::string& key) const;

  // Keys become file names: bytes outside [A-Za-z0-9._-] as %XX ('/' is %2F).
  static std::string encode_key(const std::string& key);
  static std::string decode_key(const std::string& name);

  [[nodiscard]] std::filesystem::path record_path(const std::string& key) const;
  [[nodiscard]] std::filesystem::path lease_path(lease_id id) const;

  static std::string read_small(const std::filesystem::path& path);
  static void write_small(const std::filesystem::path& path, const std::string& text);

  // Record file: "dcrrec1 <revision> <lease> <length> <xxh64 hex>\n" then the value bytes.
  std::optional<control_record> read_record(const std::string& key) const;

  std::int64_t read_revision() const;

  // Journal: "dcrtxn1 <revision> <writes>\n", then per write
  // "<erase 0|1> <lease> <key length> <value length>\n<key><value>".
  void apply(std::int64_t rev, std::span<const key_write> writes);

  // Applies DIR/journal if present (idempotent), then removes it.
  void replay_journal();

  void write_lease(lease_id id, std::chrono::seconds ttl);

  bool lease_expired(lease_id id) const;

  // Under the exclusive lock: erase the records of every expired lease, in one transaction.
  void collect_expired_leases();

  void drop_lease(lease_id id);

  std::filesystem::path dir_;
  std::chrono::milliseconds poll_;
};

static_assert(control_plane<file_control_plane>);

}  // namespace dcr

#include "dcr/detail/protocol/file_control_plane.inl"
