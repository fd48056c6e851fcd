// dcr/protocol/agent_support.hpp: what the three agents share: retrying control-plane
// operations through an outage until a deadline, reading typed records, process identity and
// peak memory.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "dcr/error.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/records.hpp"

namespace dcr {

/// One stage of an attempt, for pictures and the overlap figure (the owner and receiver agents'
/// last_timeline()): seconds since the Unix epoch (system clock), so that spans of different
/// processes on one machine line up.
struct stage_span {
  std::string stage;  ///< "build", "compress+put", "apply"
  double begin = 0, end = 0;
};

/// Seconds since the Unix epoch now (system clock).
inline double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Runs `op`; while it throws control_plane_unavailable, waits (backoff from 10 ms to 500 ms)
/// and runs it again, until `deadline`, then throws deadline_exceeded naming `what` and the
/// last error. Every control-plane operation of an agent goes through this, so an outage
/// shorter than the agent's deadline is waited out.
template <class F>
auto with_retry(const char* what, protocol_clock::time_point deadline, F&& op) -> decltype(op()) {
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    try {
      return op();
    } catch (const error& e) {
      if (e.dcr_code() != errc::control_plane_unavailable) throw;
      if (protocol_clock::now() + pause >= deadline)
        throw error(errc::deadline_exceeded,
                    std::string(what) + ": control plane unavailable until the deadline: " +
                        e.what());
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }
}

/// A record of type R under `key` and its revision, if present.
template <class R>
struct typed_record {
  R value;
  std::int64_t revision = 0;
};

template <class R, control_plane Plane>
std::optional<typed_record<R>> read_record(Plane& plane, const std::string& key) {
  auto r = plane.get(key);
  if (!r) return std::nullopt;
  return typed_record<R>{decode_record<R>(key, r->value), r->revision};
}

template <class R, control_plane Plane>
std::vector<R> read_records(Plane& plane, const std::string& prefix) {
  std::vector<R> out;
  for (const auto& r : plane.list(prefix)) out.push_back(decode_record<R>(r.key, r.value));
  return out;
}

/// A name unique to this process start (host, pid, random), telling a restarted agent from its
/// earlier self.
inline std::string make_incarnation() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::random_device rd;
  return std::string(host) + ":" + std::to_string(::getpid()) + ":" + std::to_string(rd());
}

/// Peak resident memory of this process (getrusage), in bytes.
inline std::uint64_t peak_rss_bytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}

/// Milliseconds since the Unix epoch (deadlines written into records, comparable across
/// processes on one machine).
inline std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Keeps a lease alive from a thread of its own (every ttl / 3) until destroyed. A renewal
/// that throws (whatever it throws) is retried after 100 ms; no exception leaves the thread.
template <control_plane Plane>
class lease_keeper {
 public:
  lease_keeper(Plane& plane, lease_id lease, std::chrono::seconds ttl)
      : plane_(&plane), lease_(lease), period_(std::chrono::duration_cast<std::chrono::milliseconds>(ttl) / 3),
        thread_([this] { loop(); }) {}
  lease_keeper(const lease_keeper&) = delete;
  lease_keeper& operator=(const lease_keeper&) = delete;
  ~lease_keeper() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  /// False once a renewal found the lease expired (its records are gone).
  [[nodiscard]] bool alive() const noexcept { return alive_.load(); }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    auto wait = period_;
    while (!stop_) {
      wake_.wait_for(lock, wait, [&] { return stop_; });
      if (stop_) return;
      lock.unlock();
      wait = period_;
      try {
        if (!plane_->keep_alive(lease_)) {
          alive_ = false;
          return;
        }
      } catch (...) {
        // Unreachable for now (an outage, or a renewal failing in any other way: nothing a
        // renewal throws may escape this thread, which would std::terminate the process): the
        // lease lives until its ttl; try again soon, so that renewals resume as soon as the
        // cause ends. If it outlasts the ttl, the next renewal that gets through reports the
        // lease gone.
        wait = std::chrono::milliseconds(100);
      }
      lock.lock();
    }
  }

  Plane* plane_;
  lease_id lease_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> alive_{true};
  std::thread thread_;
};

}  // namespace dcr
