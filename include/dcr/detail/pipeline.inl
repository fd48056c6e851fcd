// dcr/detail/pipeline.inl: the bodies of dcr/pipeline.hpp (included at its end).
#pragma once

namespace dcr {

template <class T>
pipeline_stage<T>::pipeline_stage(std::size_t depth, std::function<void(T&)> work,
                                  std::function<bool()> idle)
    : depth_(depth), work_(std::move(work)), idle_(std::move(idle)) {
  DCR_EXPECTS(depth_ >= 1, errc::invalid_argument, "pipeline_stage: depth must be >= 1");
}

template <class T>
pipeline_stage<T>::~pipeline_stage() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

template <class T>
void pipeline_stage<T>::submit(T item) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  ++submitting_;  // the item comes next: no idle step starts meanwhile
  room_.wait(lock, [&] { return in_flight_ < depth_ || error_; });
  --submitting_;
  if (error_) wake_.notify_all();  // idle work may go on once this producer has left
  rethrow(lock);
  queue_.push_back(std::move(item));
  ++in_flight_;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  wake_.notify_all();
}

template <class T>
void pipeline_stage<T>::drain() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  room_.wait(lock, [&] { return in_flight_ == 0; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rethrow(lock);
}

template <class T>
void pipeline_stage<T>::discard() noexcept {
  std::unique_lock lock(mutex_);
  in_flight_ -= queue_.size();
  queue_.clear();
  idle_pending_ = false;
  room_.wait(lock, [&] { return in_flight_ == 0 && !idle_running_; });
  error_ = nullptr;
  room_.notify_all();
}

template <class T>
void pipeline_stage<T>::wake_idle() {
  std::lock_guard lock(mutex_);
  idle_pending_ = static_cast<bool>(idle_);
  if (!thread_.joinable() && idle_pending_) thread_ = std::thread([this] { loop(); });
  wake_.notify_all();
}

template <class T>
double pipeline_stage<T>::wait_seconds() const {
  std::lock_guard lock(mutex_);
  return wait_seconds_;
}

template <class T>
double pipeline_stage<T>::busy_seconds() const {
  std::lock_guard lock(mutex_);
  return busy_seconds_;
}

template <class T>
void pipeline_stage<T>::rethrow(std::unique_lock<std::mutex>&) {
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

template <class T>
void pipeline_stage<T>::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock,
               [&] { return stop_ || !queue_.empty() || (idle_pending_ && submitting_ == 0); });
    if (stop_) return;
    if (queue_.empty()) {  // idle work fills the time between items
      idle_running_ = true;
      lock.unlock();
      bool more = false;
      try {
        more = idle_();
      } catch (...) {
        more = false;  // idle work is a hint; its failures are the producer's to meet
      }
      lock.lock();
      idle_running_ = false;
      if (!more) idle_pending_ = false;
      room_.notify_all();  // discard() waits for the idle step to end
      continue;
    }
    T item = std::move(queue_.front());
    queue_.pop_front();
    std::exception_ptr failure;
    if (!error_) {
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        work_(item);
      } catch (...) {
        failure = std::current_exception();
      }
      const double busy =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      busy_seconds_ += busy;
      if (failure) {
        error_ = failure;
        in_flight_ -= queue_.size();  // what was queued after the failure is dropped
        queue_.clear();
        idle_pending_ = false;  // and the idle work, which only served the items to come
      }
    }
    --in_flight_;
    room_.notify_all();
  }
}

}  // namespace dcr
