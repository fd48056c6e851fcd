// tests/io/io_test_util.hpp: scratch directories, file helpers and deterministic test data for
// the io tests.
#pragma once

#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dcr/error.hpp"

namespace io_test {

/// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class scratch_dir {
 public:
  scratch_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base ? base : "/tmp") + "/dcr-io-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }
  /// Names of the files in the directory, sorted.
  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

inline void write_file(const std::filesystem::path& p, std::span<const std::byte> bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

/// Runs `f` and returns the dcr::error it throws (fails the test if it throws nothing else).
template <class F>
dcr::error thrown_error(F&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e;
  }
  FAIL("expected a dcr::error");
  return dcr::error(dcr::errc::ok, "");
}

/// Runs `f` in a child process (fork) and returns its exit status: 0 if it returned, 3 if it
/// threw, or whatever status it ended the process with (a crash injection's), -1 if killed.
inline int run_in_child(const std::function<void()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      f();
    } catch (...) {
      std::_Exit(3);
    }
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// What a dcr::io::progress_callback received: (done, total) per call.
struct progress_calls {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;

  /// A callback recording into this object (which must outlive it).
  std::function<void(std::uint64_t, std::uint64_t)> callback() {
    return [this](std::uint64_t done, std::uint64_t total) { calls.emplace_back(done, total); };
  }
  /// Checks one operation's calls: all with `total`, `done` growing to it and never past it.
  void check(std::uint64_t total) const {
    REQUIRE_FALSE(calls.empty());
    std::uint64_t last = 0;
    for (const auto& [done, t] : calls) {
      CHECK(t == total);
      CHECK(done >= last);
      CHECK(done <= total);
      last = done;
    }
    CHECK(calls.back().first == total);
  }
};

}  // namespace io_test
