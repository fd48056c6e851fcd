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
  static file_descriptor open(const std::filesystem::path& path, int flags, mode_t mode = 0644) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd < 0) throw_io_error("cannot open", path, errno);
    return file_descriptor(fd);
  }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

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
inline void write_all_at(int fd, std::span<const std::byte> bytes, std::uint64_t offset,
                         const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error("cannot write", path, errno);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

/// fsync(2) of `fd`; `path` names it in errors.
inline void sync_file(int fd, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) throw_io_error("cannot fsync", path, errno);
}

/// The directory holding `path` ("." for a bare file name).
[[nodiscard]] inline std::filesystem::path parent_directory(const std::filesystem::path& path) {
  auto dir = path.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

/// fsync of a directory, so that renames and unlinks in it survive a crash.
inline void sync_directory(const std::filesystem::path& dir) {
  const auto fd = file_descriptor::open(dir, O_RDONLY | O_DIRECTORY);
  if (::fsync(fd.get()) != 0) throw_io_error("cannot fsync directory", dir, errno);
}

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
inline void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw_io_error("cannot rename to '" + to.string() + "' the file", from, errno);
  sync_directory(parent_directory(to));
}

/// unlink(2) then fsync of the directory. A missing file is not an error.
inline void remove_durably(const std::filesystem::path& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return;
    throw_io_error("cannot remove", path, errno);
  }
  sync_directory(parent_directory(path));
}

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
inline void require_single_regular_file(const std::filesystem::path& path,
                                        std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) throw_io_error("cannot stat", path, errno);
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(path, ec);
    throw error(errc::invalid_argument,
                std::string(what) + " '" + path.string() + "' is a symbolic link" +
                    (ec ? std::string() : " to '" + target.string() + "'") +
                    ": an in-place apply renames and rewrites the file it is given, which would "
                    "replace the link and leave the file it points to (in a Hugging Face cache, "
                    "a blob that other snapshots may share) as it was; apply to a new file or "
                    "directory with -o instead, or first replace the link by a copy of its "
                    "target (cp --remove-destination \"$(readlink -f " + path.string() + ")\" " +
                    path.string() + ")");
  }
  DCR_EXPECTS(S_ISREG(st.st_mode), errc::invalid_argument,
              std::string(what) + " '" + path.string() + "' is not a regular file");
  DCR_EXPECTS(st.st_nlink == 1, errc::invalid_argument,
              std::string(what) + " '" + path.string() + "' has " +
                  std::to_string(st.st_nlink) + " hard links; other names would see it change");
}

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
  static directory_lock lock(const std::filesystem::path& dir, bool wait) {
    auto fd = file_descriptor::open(dir, O_RDONLY | O_DIRECTORY);
    while (::flock(fd.get(), LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK && !wait) return {};
      throw_io_error("cannot lock the directory", dir, errno);
    }
    directory_lock l;
    l.fd_ = std::move(fd);
    return l;
  }
  file_descriptor fd_;
};

/// Maps in the pages of `bytes`, part of a file mapping, ahead of their use, so that a reader
/// that comes later takes no page faults there: madvise(MADV_POPULATE_READ) where the kernel
/// has it (Linux 5.14 and later), otherwise one read per page. A hint: errors are ignored.
inline void prefault(std::span<const std::byte> bytes) noexcept {
  if (bytes.empty()) return;
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(bytes.data()) & ~(page - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(bytes.data() + bytes.size());
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // linux/mman.h, Linux 5.14
#endif
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the page holding bytes.data()
  if (::madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_READ) == 0) return;
  const volatile std::byte* p = bytes.data();
  for (std::uintptr_t at = 0; at < bytes.size(); at += page) (void)p[at];
}

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
  static mapped_file open_read(const std::filesystem::path& path, bool populate = false) {
    mapped_file m;
    m.path_ = path;
    m.fd_ = file_descriptor::open(path, O_RDONLY);
    m.map(PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0));
    return m;
  }
  /// Maps `path` read-write and shared: stores through bytes() change the file. The file's
  /// size is fixed while mapped.
  static mapped_file open_write(const std::filesystem::path& path, bool populate = false) {
    mapped_file m;
    m.path_ = path;
    m.writable_ = true;
    m.fd_ = file_descriptor::open(path, O_RDWR);
    m.map(PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0));
    return m;
  }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The mapping, writable; only for a mapping made by open_write (else invalid_argument).
  [[nodiscard]] std::span<std::byte> writable_bytes() {
    DCR_EXPECTS(writable_, errc::invalid_argument,
                "mapped_file: '" + path_.string() + "' is mapped read-only");
    return {data_, size_};
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

  /// Flushes a writable mapping's stores to stable storage (msync MS_SYNC, then fsync).
  void sync() {
    if (data_ != nullptr && writable_ && ::msync(data_, size_, MS_SYNC) != 0)
      throw_io_error("cannot msync", path_, errno);
    if (writable_) sync_file(fd_.get(), path_);
  }

 private:
  void map(int prot, int flags) {
    size_ = static_cast<std::size_t>(file_size(fd_.get(), path_));
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, prot, flags, fd_.get(), 0);
    if (p == MAP_FAILED) throw_io_error("cannot map", path_, errno);
    data_ = static_cast<std::byte*>(p);
  }
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

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
  explicit atomic_file(std::filesystem::path target) : target_(std::move(target)) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const auto tag = std::to_string(::getpid()) + "-" + std::to_string(rd() % 1000000007u);
      temp_ = hidden_sibling(target_, ".tmp-" + tag);
      const int fd = ::open(temp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) {
        fd_ = file_descriptor(fd);
        return;
      }
      if (errno != EEXIST) throw_io_error("cannot create", temp_, errno);
    }
    throw_io_error("cannot create a temporary file for", target_, EEXIST);
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { discard(); }

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }
  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }

  /// Writes `bytes` at `offset` of the temporary file.
  void write_at(std::span<const std::byte> bytes, std::uint64_t offset) {
    write_all_at(fd_.get(), bytes, offset, temp_);
  }
  /// Sets the temporary file's permission bits (fchmod), e.g. to those of the file it replaces.
  void set_permissions(mode_t mode) {
    if (::fchmod(fd_.get(), mode) != 0) throw_io_error("cannot set the permissions of", temp_, errno);
  }
  /// Sets the temporary file's size (ftruncate).
  void resize(std::uint64_t size) {
    if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0)
      throw_io_error("cannot resize", temp_, errno);
  }
  /// fsync of the temporary file only (the crash-safe protocols order their steps with it).
  void sync() { sync_file(fd_.get(), temp_); }
  /// fsync, close, rename over the target, fsync the directory. Afterwards the object owns
  /// nothing.
  void commit() {
    sync_file(fd_.get(), temp_);
    fd_.reset();
    rename_durably(temp_, target_);
    committed_ = true;
  }
  /// Removes the temporary file (no-op after commit()).
  void discard() noexcept {
    if (committed_ || temp_.empty()) return;
    fd_.reset();
    ::unlink(temp_.c_str());
    temp_.clear();
  }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  file_descriptor fd_;
  bool committed_ = false;
};

}  // namespace dcr::io
