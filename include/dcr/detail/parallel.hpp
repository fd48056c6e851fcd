// dcr/detail/parallel.hpp: a small fork-join loop over indices (implementation only).
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dcr::detail {

/// Calls f(t, i) once for every i in [0, n) on min(threads, n) threads: the calling thread is
/// t = 0, the others (t = 1, 2, ...) are started here and joined before returning. Indices are
/// handed out in increasing order to whichever thread is free. After the first exception no
/// thread takes a new index; it is rethrown once every thread has stopped.
template <class F>
void parallel_for(std::size_t n, std::size_t threads, F&& f) {
  if (threads > n) threads = n;
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) f(std::size_t{0}, i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto run = [&](std::size_t t) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        f(t, i);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  try {
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  } catch (...) {  // a thread could not be started: the ones that run share the work
  }
  run(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace dcr::detail
