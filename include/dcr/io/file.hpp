// dcr/io/file.hpp: the POSIX file primitives the checkpoint tools build on: owned descriptors,
// read-only and read-write memory maps, positioned writes that never stop short, and durable
// renames (temporary file in the same directory, fsync, rename, fsync of the directory).
//
// Every failure throws dcr::error(errc::io_error) naming the operation, the path and the
// system's reason. Nothing here buffers: a write returns once the kernel holds the bytes, and
// `durable` operations return once they are on stable storage as far as fsync promises.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "dcr/error.hpp"

namespace dcr::io {

/// Throws dcr::error(io_error) "<what> '<path>': <strerror(err)>".
[[noreturn]] inline void throw_io_error(std::string_view what, const std::filesystem::path& path,
                                        int err) {
  throw error(errc::io_error,
              std::string(what) + " '" + path.string() + "': " + std::strerror(err));
}

/// An owned file descriptor, closed on destruction. Move-only.
class file_descriptor {
 public:
  file_descriptor() = default;
  explicit file_descriptor(int fd) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  file_descriptor& operator=(file_descriptor&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  ~file_descriptor() { reset(); }

  /// open(2) with O_CLOEXEC added; throws io_error naming `path` on failure.
  static file_descriptor open(const std::filesystem::path& path, int flags, mode_t mode = 0644);

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

/// Size in bytes of the open file `fd` (fstat); `path` names it in errors.
[[nodiscard]] inline std::uint64_t file_size(int fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io_error("cannot stat", path, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

/// Writes all of `bytes` at `offset` (pwrite, retried on short writes and EINTR).
void write_all_at(int fd, std::span<const std::byte> bytes, std::uint64_t offset,
                         const std::filesystem::path& path);

/// fsync(2) of `fd`; `path` names it in errors.
void sync_file(int fd, const std::filesystem::path& path);

/// The directory holding `path` ("." for a bare file name).
[[nodiscard]] inline std::filesystem::path parent_directory(const std::filesystem::path& path) {
  auto dir = path.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

/// fsync of a directory, so that renames and unlinks in it survive a crash.
void sync_directory(const std::filesystem::path& dir);

/// `dir/.<name of path><suffix>`: a hidden file beside `path`, in the same directory (so a
/// rename between them is atomic).
[[nodiscard]] inline std::filesystem::path hidden_sibling(const std::filesystem::path& path,
                                                          std::string_view suffix) {
  std::string name = ".";
  name += path.filename().string();
  name += suffix;
  return parent_directory(path) / name;
}

/// rename(2) then fsync of the directory of `to` (both must be in one directory for atomicity).
void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to);

/// unlink(2) then fsync of the directory. A missing file is not an error.
void remove_durably(const std::filesystem::path& path);

/// Whether `path` names an existing file (lstat; a dangling link counts as existing).
[[nodiscard]] inline bool path_exists(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw_io_error("cannot stat", path, errno);
}

/// Throws invalid_argument unless `path` is a regular file (not a symbolic link) with a single
/// hard link: a file that is changed in place and renamed must have no other name through
/// which a partly written state could be seen. For a symbolic link the message says why and
/// what to do instead (-o, or replace the link by a copy). io_error if it cannot be examined.
void require_single_regular_file(const std::filesystem::path& path,
                                        std::string_view what);

/// The permission bits (mode & 07777) of the file `path` names, through symbolic links.
[[nodiscard]] inline mode_t permission_bits(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_io_error("cannot stat", path, errno);
  return st.st_mode & 07777;
}

/// Whether `a` and `b` name the same existing file.
[[nodiscard]] inline bool same_file(const std::filesystem::path& a,
                                    const std::filesystem::path& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

/// An exclusive advisory lock (flock(2)) on a directory, held by an open descriptor of it until
/// destruction (or process exit, crash included: the kernel drops it). Move-only.
class directory_lock {
 public:
  directory_lock() = default;
  /// Locks `dir`, waiting while another open descriptor holds the lock.
  static directory_lock acquire(const std::filesystem::path& dir) { return lock(dir, true); }
  /// Locks `dir` if no one else holds the lock; otherwise the result does not hold it.
  static directory_lock try_acquire(const std::filesystem::path& dir) { return lock(dir, false); }
  [[nodiscard]] bool held() const noexcept { return fd_.valid(); }

 private:
  static directory_lock lock(const std::filesystem::path& dir, bool wait);
  file_descriptor fd_;
};

/// Maps in the pages of `bytes`, part of a file mapping, ahead of their use, so that a reader
/// that comes later takes no page faults there: madvise(MADV_POPULATE_READ) where the kernel
/// has it (Linux 5.14 and later), otherwise one read per page. A hint: errors are ignored.
void prefault(std::span<const std::byte> bytes) noexcept;

/// A whole file mapped into memory: read-only (MAP_PRIVATE, PROT_READ) or read-write
/// (MAP_SHARED: stores reach the file). An empty file maps to an empty span. Move-only; unmapped
/// and closed on destruction.
class mapped_file {
 public:
  mapped_file() = default;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), fd_(std::move(o.fd_)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)), writable_(o.writable_) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      fd_ = std::move(o.fd_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      writable_ = o.writable_;
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  /// Maps `path` read-only. `populate` pre-faults every page (MAP_POPULATE): worth it when the
  /// caller reads the whole file, wasteful when it reads a header.
  static mapped_file open_read(const std::filesystem::path& path, bool populate = false);
  /// Maps `path` read-write and shared: stores through bytes() change the file. The file's
  /// size is fixed while mapped.
  static mapped_file open_write(const std::filesystem::path& path, bool populate = false);

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The mapping, writable; only for a mapping made by open_write (else invalid_argument).
  [[nodiscard]] std::span<std::byte> writable_bytes();
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

  /// Flushes a writable mapping's stores to stable storage (msync MS_SYNC, then fsync).
  void sync();

 private:
  void map(int prot, int flags);
  void unmap() noexcept;

  std::filesystem::path path_;
  file_descriptor fd_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool writable_ = false;
};

/// A new file that appears at `target` only when commit() succeeds: it is written as a hidden
/// temporary file in the same directory (`.<target name>.tmp-<random>`), and commit() fsyncs it,
/// renames it over `target` and fsyncs the directory. Destroying it without commit() removes
/// the temporary file, so a failed write leaves nothing behind.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target);
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { discard(); }

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }
  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }

  /// Writes `bytes` at `offset` of the temporary file.
  void write_at(std::span<const std::byte> bytes, std::uint64_t offset);
  /// Sets the temporary file's permission bits (fchmod), e.g. to those of the file it replaces.
  void set_permissions(mode_t mode);
  /// Sets the temporary file's size (ftruncate).
  void resize(std::uint64_t size);
  /// fsync of the temporary file only (the crash-safe protocols order their steps with it).
  void sync() { sync_file(fd_.get(), temp_); }
  /// fsync, close, rename over the target, fsync the directory. Afterwards the object owns
  /// nothing.
  void commit();
  /// Removes the temporary file (no-op after commit()).
  void discard() noexcept;

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  file_descriptor fd_;
  bool committed_ = false;
};

}  // namespace dcr::io

#include "dcr/detail/io/file.inl"
