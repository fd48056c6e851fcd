// tools/dcr/progress.hpp: a one-line progress display on stderr for long operations (bytes
// done of all, rate, time left), redrawn at most every 0.2 s and erased at the end. Shown only
// when stderr is a terminal and --quiet was not given. `dcr diff`, `dcr apply` and `dcr recover`
// draw it from dcr::io's progress callbacks (progress_line::callback).
#pragma once

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
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

  /// A dcr::io::progress_callback that updates this line (which must outlive it); empty when
  /// the line is not shown, so that the operation does not even plan its total.
  [[nodiscard]] std::function<void(std::uint64_t done, std::uint64_t total)> callback() {
    if (!enabled_) return {};
    return [this](std::uint64_t done, std::uint64_t total) { update(done, total); };
  }

  /// `done` of `total` bytes are processed. A smaller `done` or another `total` than the last
  /// call's starts a new operation (an in-place apply after the recovery it needed): the rate
  /// and the time left are measured from there.
  void update(std::uint64_t done, std::uint64_t total) {
    if (!enabled_) return;
    const auto now = clock::now();
    if (updated_ && (done < last_done_ || total != last_total_)) {
      start_ = now;
      start_done_ = done;
    }
    updated_ = true;
    last_done_ = done;
    last_total_ = total;
    if (drawn_ && now - last_ < std::chrono::milliseconds(200) && done < total) return;
    last_ = now;
    drawn_ = true;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? static_cast<double>(done - start_done_) / seconds : 0.0;
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
  bool updated_ = false;
  std::uint64_t last_done_ = 0;
  std::uint64_t last_total_ = 0;
  std::uint64_t start_done_ = 0;  // `done` when the operation measured from start_ began
  clock::time_point start_ = clock::now();
  clock::time_point last_{};
};

}  // namespace dcr_tool
