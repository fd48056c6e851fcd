// dcr/pipeline.hpp: one bounded pipeline stage, the building block of every overlap in dcr:
// the owner agent (build chunk l+1 while chunk l is packed, compressed and put), the receiver
// agent (fetch payload l+1 while payload l is applied) and the whole-checkpoint differ (scan
// while the previous payload is encoded and written).
//
// A pipeline_stage<T> runs `work(T&)` on its own thread for every submitted item, in
// submission order. At most `depth` items are in flight (queued or being worked on): submit()
// blocks until there is room, which throttles the producer when the stage falls behind, and so
// a producer that cycles through depth + 1 buffers never writes one the stage still reads.
// Between items, while nothing is queued and no producer waits in submit(), the stage runs
// the optional `idle()` work (e.g. mapping pages in ahead of the producer) until it returns
// false; wake_idle() says there is idle work again. An item a producer is about to queue goes
// first: the stage does not start an idle step in the moment between finishing an item and
// receiving the one a blocked producer hands over. The first exception thrown by `work` is kept and rethrown by the next
// submit() or drain(); items queued after it are dropped, and so is pending idle work (call
// wake_idle() again to resume it). discard() ends a use of the stage whatever happened: it
// drops queued items and pending idle work, waits for the current item and for an idle() call
// in progress, and forgets the error, so once it returns the stage's thread touches nothing the
// producer handed it (the data that idle() reads may then be released). Memory stays bounded by
// depth items.
//
// The stage's thread starts on the first submit() or wake_idle(); a stage that is never used
// starts none. The destructor drops what is queued, lets the current item or idle step finish
// and joins the thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "dcr/error.hpp"

namespace dcr {

/// One bounded stage running work(T&) on its own thread, as described at the top of this header.
template <class T>
class pipeline_stage {
 public:
  /// A stage with at most `depth` items in flight that runs `work` on each and, between items,
  /// `idle` (optional) while it returns true. Starts no thread. invalid_argument for depth 0.
  pipeline_stage(std::size_t depth, std::function<void(T&)> work,
                 std::function<bool()> idle = {});
  pipeline_stage(const pipeline_stage&) = delete;
  pipeline_stage& operator=(const pipeline_stage&) = delete;
  /// Drops what is queued, lets the current item finish, joins the thread.
  ~pipeline_stage();

  /// Queues `item` once fewer than depth items are in flight (starting the thread on first
  /// use). Rethrows the stage's pending error instead of queuing.
  void submit(T item);

  /// Waits until every submitted item was worked on; rethrows the stage's pending error.
  void drain();

  /// Drops queued items and pending idle work, waits for the current item and for an idle()
  /// call in progress, and forgets any error (the stage can be used again). Never throws.
  void discard() noexcept;

  /// There is idle work again (idle() will be called when the queue is empty).
  void wake_idle();

  /// Seconds callers of submit() and drain() spent waiting (the producer throttled).
  [[nodiscard]] double wait_seconds() const;
  /// Seconds the stage's thread spent in work().
  [[nodiscard]] double busy_seconds() const;
  [[nodiscard]] std::size_t depth() const noexcept { return depth_; }

 private:
  void rethrow(std::unique_lock<std::mutex>&);

  void loop();

  const std::size_t depth_;
  std::function<void(T&)> work_;
  std::function<bool()> idle_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, room_;
  std::deque<T> queue_;
  std::size_t in_flight_ = 0;
  std::size_t submitting_ = 0;  // producers waiting in submit() for room
  bool stop_ = false;
  bool idle_pending_ = false;
  bool idle_running_ = false;  // the thread is in idle()
  std::exception_ptr error_;
  double wait_seconds_ = 0, busy_seconds_ = 0;
  std::thread thread_;
};

}  // namespace dcr

#include "dcr/detail/pipeline.inl"
