// dcr/detail/io/file.inl: the bodies of dcr/io/file.hpp (included at its end).
#pragma once

namespace dcr::io {

inline file_descriptor file_descriptor::open(const std::filesystem::path& path, int flags,
                                             mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw_io_error("cannot open", path, errno);
  return file_descriptor(fd);
}

inline void file_descriptor::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

inline directory_lock directory_lock::lock(const std::filesystem::path& dir, bool wait) {
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

inline mapped_file mapped_file::open_read(const std::filesystem::path& path, bool populate) {
  mapped_file m;
  m.path_ = path;
  m.fd_ = file_descriptor::open(path, O_RDONLY);
  m.map(PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0));
  return m;
}

inline mapped_file mapped_file::open_write(const std::filesystem::path& path, bool populate) {
  mapped_file m;
  m.path_ = path;
  m.writable_ = true;
  m.fd_ = file_descriptor::open(path, O_RDWR);
  m.map(PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0));
  return m;
}

inline std::span<std::byte> mapped_file::writable_bytes() {
  DCR_EXPECTS(writable_, errc::invalid_argument,
              "mapped_file: '" + path_.string() + "' is mapped read-only");
  return {data_, size_};
}

inline void mapped_file::sync() {
  if (data_ != nullptr && writable_ && ::msync(data_, size_, MS_SYNC) != 0)
    throw_io_error("cannot msync", path_, errno);
  if (writable_) sync_file(fd_.get(), path_);
}

inline void mapped_file::map(int prot, int flags) {
  size_ = static_cast<std::size_t>(file_size(fd_.get(), path_));
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, prot, flags, fd_.get(), 0);
  if (p == MAP_FAILED) throw_io_error("cannot map", path_, errno);
  data_ = static_cast<std::byte*>(p);
}

inline void mapped_file::unmap() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

inline atomic_file::atomic_file(std::filesystem::path target) : target_(std::move(target)) {
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

inline void atomic_file::write_at(std::span<const std::byte> bytes, std::uint64_t offset) {
  write_all_at(fd_.get(), bytes, offset, temp_);
}

inline void atomic_file::set_permissions(mode_t mode) {
  if (::fchmod(fd_.get(), mode) != 0) throw_io_error("cannot set the permissions of", temp_, errno);
}

inline void atomic_file::resize(std::uint64_t size) {
  if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0)
    throw_io_error("cannot resize", temp_, errno);
}

inline void atomic_file::commit() {
  sync_file(fd_.get(), temp_);
  fd_.reset();
  rename_durably(temp_, target_);
  committed_ = true;
}

inline void atomic_file::discard() noexcept {
  if (committed_ || temp_.empty()) return;
  fd_.reset();
  ::unlink(temp_.c_str());
  temp_.clear();
}

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

inline void sync_file(int fd, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) throw_io_error("cannot fsync", path, errno);
}

inline void sync_directory(const std::filesystem::path& dir) {
  const auto fd = file_descriptor::open(dir, O_RDONLY | O_DIRECTORY);
  if (::fsync(fd.get()) != 0) throw_io_error("cannot fsync directory", dir, errno);
}

inline void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw_io_error("cannot rename to '" + to.string() + "' the file", from, errno);
  sync_directory(parent_directory(to));
}

inline void remove_durably(const std::filesystem::path& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return;
    throw_io_error("cannot remove", path, errno);
  }
  sync_directory(parent_directory(path));
}

inline void require_single_regular_file(const std::filesystem::path& path, std::string_view what) {
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
                    "target (cp --remove-destination \"$(readlink -f " +
                    path.string() + ")\" " + path.string() + ")");
  }
  DCR_EXPECTS(S_ISREG(st.st_mode), errc::invalid_argument,
              std::string(what) + " '" + path.string() + "' is not a regular file");
  DCR_EXPECTS(st.st_nlink == 1, errc::invalid_argument,
              std::string(what) + " '" + path.string() + "' has " + std::to_string(st.st_nlink) +
                  " hard links; other names would see it change");
}

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

}  // namespace dcr::io
