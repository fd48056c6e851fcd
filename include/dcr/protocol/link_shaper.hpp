// dcr/protocol/link_shaper.hpp: a rate-limited link (a token bucket in virtual-time form), for
// shaping every cross-cluster flow of a transport to a fixed rate in benchmarks and tests.
//
// A link carries at most `rate` bytes per second on average. Each consume(n) books the link for
// n / rate seconds after the end of the previous booking (or from now, when the link has been
// idle) and returns once the booking's end is at most `burst` bytes' worth of time away, so a
// sender is never more than `burst` bytes ahead of the wire. Call it per chunk as bytes go out
// (say 64 KiB), not once per message, so that bytes flow evenly.
//
// One link may be shared by several threads and by several processes on one machine: processes
// that open link_shaper::shared() on the same file book the same flow (its state, three 64-bit
// counters, lives in that file, updated with lock-free atomics). The steady clock is the
// system-wide monotonic clock, so bookings from different processes line up.
//
// busy_seconds() is the total time the link was booked: for a flow that carried everything a
// step sent, the transport lower bound of that step.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "dcr/error.hpp"

namespace dcr {

/// Parses a link rate: a number with a unit, bytes ("B/s", "kB/s", "MB/s", "GB/s", decimal;
/// "KiB/s", "MiB/s", "GiB/s", binary) or bits ("bps", "kbps", "Mbps", "Gbps"). "0" or
/// "unlimited" gives 0 (no shaping). Returns bytes per second; throws errc::invalid_argument
/// naming the text otherwise.
inline double parse_link_rate(const std::string& text) {
  if (text == "0" || text == "unlimited") return 0;
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  struct known {
    const char* name;
    double scale;
  };
  static constexpr known units[] = {
      {"B/s", 1},       {"kB/s", 1e3},          {"KB/s", 1e3},     {"MB/s", 1e6},
      {"GB/s", 1e9},    {"KiB/s", 1024.0},      {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0},
      {"bps", 1 / 8.0}, {"kbps", 1e3 / 8},      {"Kbps", 1e3 / 8}, {"Mbps", 1e6 / 8},
      {"Gbps", 1e9 / 8}};
  for (const auto& u : units)
    if (used > 0 && unit == u.name && value >= 0 && std::isfinite(value)) return value * u.scale;
  throw error(errc::invalid_argument,
              "link rate '" + text +
                  "' is not a number with a unit (e.g. 20MB/s, 100MiB/s, 5Gbps; 0 for unlimited)");
}

/// A shaped link; see the file comment. Cheap to move; thread-safe.
class link_shaper {
 public:
  /// A link private to this process. `bytes_per_second` 0 means unlimited (nothing waits,
  /// bytes are still counted).
  explicit link_shaper(double bytes_per_second, double burst_bytes = 256 * 1024)
      : owned_(std::make_unique<counters>()), state_(owned_.get()),
        rate_(bytes_per_second), burst_(burst_bytes) {
    DCR_EXPECTS(bytes_per_second >= 0 && burst_bytes >= 0, errc::invalid_argument,
                "link_shaper: negative rate or burst");
  }

  /// The link whose state lives in `file` (created, zero-filled, if missing): every process
  /// that opens the same file with the same rate books one flow.
  static link_shaper shared(const std::filesystem::path& file, double bytes_per_second,
                            double burst_bytes = 256 * 1024) {
    link_shaper l(bytes_per_second, burst_bytes);
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DCR_EXPECTS(fd >= 0, errc::io_error, "link_shaper: cannot open '" + file.string() + "'");
    const bool sized = ::ftruncate(fd, sizeof(counters)) == 0;
    void* p = sized ? ::mmap(nullptr, sizeof(counters), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    ::close(fd);
    DCR_EXPECTS(p != MAP_FAILED, errc::io_error,
                "link_shaper: cannot map '" + file.string() + "'");
    l.mapped_ = std::shared_ptr<void>(p, [](void* q) { ::munmap(q, sizeof(counters)); });
    l.owned_.reset();
    l.state_ = static_cast<counters*>(p);
    return l;
  }

  /// Books `bytes` on the link and waits until they may go (see the file comment).
  void consume(std::uint64_t bytes) {
    std::atomic_ref<std::uint64_t>(state_->bytes).fetch_add(bytes, std::memory_order_relaxed);
    local_bytes_->fetch_add(bytes, std::memory_order_relaxed);
    if (rate_ <= 0 || bytes == 0) return;
    const auto cost = static_cast<std::int64_t>(std::llround(static_cast<double>(bytes) * 1e9 / rate_));
    std::atomic_ref<std::int64_t>(state_->busy_ns).fetch_add(cost, std::memory_order_relaxed);
    std::atomic_ref<std::int64_t> booked(state_->booked_until_ns);
    std::int64_t old = booked.load(std::memory_order_relaxed), until = 0;
    do {
      until = std::max(old, now_ns()) + cost;
    } while (!booked.compare_exchange_weak(old, until, std::memory_order_acq_rel));
    const auto release = until - static_cast<std::int64_t>(burst_ * 1e9 / rate_);
    const auto wait = release - now_ns();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
  }

  /// Bytes booked on the link so far (by every user of a shared link).
  [[nodiscard]] std::uint64_t bytes() const {
    return std::atomic_ref<std::uint64_t>(state_->bytes).load(std::memory_order_relaxed);
  }
  /// Bytes booked through this handle (and its moved-from predecessors) only.
  [[nodiscard]] std::uint64_t local_bytes() const { return local_bytes_->load(); }
  /// Seconds the link was booked so far: bytes / rate (0 when unlimited).
  [[nodiscard]] double busy_seconds() const {
    return static_cast<double>(std::atomic_ref<std::int64_t>(state_->busy_ns).load()) * 1e-9;
  }
  [[nodiscard]] double bytes_per_second() const noexcept { return rate_; }

 private:
  struct counters {
    std::int64_t booked_until_ns = 0;  // steady clock
    std::int64_t busy_ns = 0;
    std::uint64_t bytes = 0;
  };
  static_assert(std::atomic_ref<std::int64_t>::is_always_lock_free &&
                std::atomic_ref<std::uint64_t>::is_always_lock_free);

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::unique_ptr<counters> owned_;
  std::shared_ptr<void> mapped_;
  std::unique_ptr<std::atomic<std::uint64_t>> local_bytes_ = std::make_unique<std::atomic<std::uint64_t>>(0);
  counters* state_;
  double rate_;
  double burst_;
};

}  // namespace dcr
