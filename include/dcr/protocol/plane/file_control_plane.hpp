// dcr/protocol/plane/file_control_plane.hpp: a control plane in a directory on a local or shared
// filesystem (the embedded default of `dcr simulate`). Survives a crash of any process at any
// point: a record is never torn, a transaction is never half applied, a revision is never
// reused.
//
// Layout of the directory DIR (made by create(); opening a directory without the marker is an
// error, so a store whose directory vanished is reported unavailable instead of silently
// recreated empty):
//   DIR/dcr-control-plane   marker
//   DIR/lock                flock(2): exclusive for writes, shared for reads
//   DIR/revision            the store revision (decimal)
//   DIR/next-lease          the last lease id granted (decimal)
//   DIR/journal             a transaction being applied (present only between steps 2 and 4)
//   DIR/records/<key>       one file per record: header (revision, lease, length, xxh64), value
//   DIR/leases/<id>         expiry time (system clock, nanoseconds) and ttl
// Every file is written as DIR/.../.<name>.tmp (write, fsync), renamed over <name>, and its
// directory fsynced; a leftover temporary of a crashed writer is overwritten by the next one.
// A transaction, under the exclusive lock: (1) replays a leftover journal, (2) checks its
// compares, writes the journal (temporary, fsync, rename, fsync of DIR: the commit point), (3)
// writes each record as temporary + fsync + rename, erases, writes the revision, fsyncs the
// directories, (4) removes the journal. A crash before the journal's rename loses the
// transaction whole; a crash after it is rolled forward by the next operation. Every operation
// replays a leftover journal first: those that write (transact, the collection of expired
// leases, grant_lease, keep_alive, revoke, wait_for_change) under the exclusive lock before
// anything else, those that read (get, list, revision) by taking the exclusive lock when they
// find one, so that none reads a state without a transaction that passed its commit point and
// none writes a journal over one that is still to be applied.
// Leases use the system clock, shared by processes on one machine (on a shared mount, the
// hosts' clocks must agree to well within a ttl). wait_for_change polls the revision file
// (every poll_interval) and collects expired leases. flock works on local filesystems and on
// NFSv4 (Linux maps it to byte-range locks).
// Foreign files: a name in records/ that encode_key cannot have written (an editor's backup, a
// lower-case escape, a name with '+' or '~'), a name in leases/ that is not a lease id (a
// positive decimal below 2^63, as grant_lease writes it), and anything there that is not a
// regular file, are skipped, never read as records or leases, and reported once per handle
// through the foreign-file sink (by default a line on stderr). Hidden names (a leading '.')
// are temporaries and skipped silently.
// Every failure of the filesystem (directory gone, unwritable, I/O error) throws
// errc::control_plane_unavailable naming the directory, the operation and the key; so does a
// damaged file of the plane's own (a record, lease, journal or counter file whose content does
// not parse or whose checksum disagrees), naming that file: the store cannot be used until
// an operator repairs or removes it, which the agents wait for as for an outage.
#pragma once
#include "dcr/config.hpp"
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dcr/codec/item.hpp"
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

  /// Test hook for crash-point tests: called just before each step that changes the directory
  /// or makes a change durable, with the step ("write", "fsync", "rename", "unlink") and the
  /// path it acts on (the temporary for "write" and a file's "fsync", the directory for a
  /// directory's "fsync"). A hook that throws fails the operation at that step (as an I/O error
  /// would: control_plane_unavailable); one that _exit()s kills the writer there. Set it before
  /// the handle is shared between threads; an empty hook (the default) costs nothing.
  using step_hook = std::function<void(std::string_view step, const std::filesystem::path& path)>;
  void set_step_hook(step_hook hook) { hook_ = std::move(hook); }

  /// Where foreign files (see the header comment) are reported: called once per handle for
  /// each such path, with why it was skipped. The default writes one line to stderr; an empty
  /// function skips them silently.
  using foreign_file_sink =
      std::function<void(const std::filesystem::path& path, const std::string& why)>;
  void set_foreign_file_sink(foreign_file_sink sink);

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
    }
  }

  void check_marker(std::string_view op, const std::string& key = "-") const;

  io::file_descriptor take_lock(int mode, std::string_view op, const std::string& key) const;

  // The exclusive lock, with a leftover journal replayed: what every operation that writes
  // starts with.
  io::file_descriptor lock_to_write(std::string_view op, const std::string& key);

  // The shared lock, or the exclusive one if a journal is left over (then replayed): what
  // every operation that only reads starts with.
  io::file_descriptor lock_to_read(std::string_view op, const std::string& key);

  // Keys become file names: bytes outside [A-Za-z0-9._-] as %XX ('/' is %2F), a leading '.'
  // as %2E, the empty key as "%".
  static std::string encode_key(const std::string& key);
  // The key whose encode_key is `name`; nullopt for any other name (a foreign file).
  static std::optional<std::string> decode_key(const std::string& name);
  // The lease id whose file name is `name`; nullopt for any other name (a foreign file).
  static std::optional<lease_id> decode_lease(const std::string& name);

  // Whether `entry` of records/ or leases/ is to be skipped: a temporary (silently) or a
  // foreign file (reported through the sink, once per handle). Otherwise sets `name`.
  bool skip_entry(const std::filesystem::directory_entry& entry, bool lease_dir,
                  std::string& name) const;
  void report_foreign(const std::filesystem::path& path, const std::string& why) const;

  void step(std::string_view what, const std::filesystem::path& path) const {
    if (hook_) hook_(what, path);
  }

  [[nodiscard]] std::filesystem::path record_path(const std::string& key) const;
  [[nodiscard]] std::filesystem::path lease_path(lease_id id) const;

  static std::string read_small(const std::filesystem::path& path);
  // Temporary (write, fsync), rename, fsync of the directory; each step through step().
  void write_small(const std::filesystem::path& path, const std::string& text) const;
  // unlink (a missing file is not an error), fsync of the directory; each step through step().
  void remove_small(const std::filesystem::path& path) const;
  void sync_dir(const std::filesystem::path& dir) const;

  // A counter file (revision, next-lease): a decimal, 0 if the file is absent.
  static std::int64_t read_counter(const std::filesystem::path& path);

  // Record file: "dcrrec1 <revision> <lease> <length> <xxh64 hex>\n" then the value bytes.
  std::optional<control_record> read_record(const std::string& key) const;

  std::int64_t read_revision() const;

  // Journal: "dcrtxn1 <revision> <writes>\n", then per write
  // "<erase 0|1> <lease> <key length> <value length>\n<key><value>". The transaction gets the
  // next revision. Refuses to run while a journal is left over (lock_to_write replays it
  // first): writing a journal over one past its commit point would lose that transaction.
  void apply(std::span<const key_write> writes);

  // Applies DIR/journal if present (idempotent), then removes it.
  void replay_journal();

  void write_lease(lease_id id, std::chrono::seconds ttl);

  struct lease_file {
    std::int64_t expiry_ns = 0;
    std::int64_t ttl_s = 0;
  };
  // The lease file of `id`, nullopt if there is none.
  std::optional<lease_file> read_lease(lease_id id) const;

  bool lease_expired(lease_id id) const;

  // Under the exclusive lock: erase the records of every expired lease, in one transaction.
  void collect_expired_leases();

  void drop_lease(lease_id id);

  // The foreign files this handle (and its copies) reported, and where to.
  struct foreign_files {
    std::mutex mutex;
    std::set<std::string> reported;
    foreign_file_sink sink;
  };

  std::filesystem::path dir_;
  std::chrono::milliseconds poll_;
  step_hook hook_;
  std::shared_ptr<foreign_files> foreign_;
};

static_assert(control_plane<file_control_plane>);

}  // namespace dcr

#include "dcr/detail/protocol/plane/file_control_plane.inl"
