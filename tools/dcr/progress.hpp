// tools/dcr/progress.hpp: a one-line progress display on stderr for long operations (bytes
// done of all, rate, time left), redrawn at most every 0.2 s and erased at the end. Shown only
// when stderr is a terminal and --quiet was not given.
#pragma once

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dcr_tool {

/// Whether to show progress: stderr is a terminal and the user did not ask for quiet.
inline bool progress_wanted(bool quiet) { return !quiet && ::isatty(STDERR_FILENO) == 1; }

class progress_line {
 public:
  progress_line(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { finish(); }

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  /// `done` of `total` bytes are processed.
  void update(std::uint64_t done, std::uint64_t total) {
    if (!enabled_) return;
    const auto now = clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(200) && done < total) return;
    last_ = now;
    drawn_ = true;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
    const std::string left =
        rate > 0 && done < total
            ? fmt::format("{:.0f} s left", static_cast<double>(total - done) / rate)
            : std::string("done");
    fmt::print(stderr, "\r{}: {:.1f} / {:.1f} MB ({:.0f}%), {:.0f} MB/s, {}\x1b[K", label_,
               static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6,
               total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
               rate / 1e6, left);
    std::fflush(stderr);
  }
  /// Erases the line (if drawn).
  void finish() {
    if (!drawn_) return;
    fmt::print(stderr, "\r\x1b[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  clock::time_point start_ = clock::now();
  clock::time_point last_{};
};

}  // namespace dcr_tool
