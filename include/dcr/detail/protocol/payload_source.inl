// dcr/detail/protocol/payload_source.inl: the bodies of dcr/protocol/payload_source.hpp (included
// at its end).
#pragma once

namespace dcr {

template <payload_store Store>
get_status get_listed(const Store& store, const payload_id& id, std::vector<std::byte>& out,
                      get_control control, std::uint64_t expected_bytes) {
  const bool known = expected_bytes != unknown_payload_size;
  // A cap of 0 means the store's own: an empty payload is held to its size below instead.
  if (known && expected_bytes != 0 && (control.max_bytes == 0 || control.max_bytes > expected_bytes))
    control.max_bytes = expected_bytes;
  const get_status status = get_with(store, id, out, control);
  DCR_EXPECTS(status != get_status::found || !known || out.size() == expected_bytes,
              errc::transport_failure,
              "payload " + to_string(id) + ": got " + std::to_string(out.size()) +
                  " bytes, its owner's manifest says " + std::to_string(expected_bytes));
  return status;
}

template <payload_store Store>
void store_source<Store>::open(const attempt_key& key, std::span<const std::uint32_t> owners) {
  cancel_in_flight();
  key_ = key;
  owners_.assign(owners.begin(), owners.end());
  std::sort(owners_.begin(), owners_.end());
  delivered_.clear();
  pending_.clear();
  sizes_.clear();
}

template <payload_store Store>
source_status store_source<Store>::next(delivery& out, protocol_clock::time_point deadline) {
  for (;;) {
    if (!in_flight_.valid() && !pending_.empty()) {
      in_flight_id_ = pending_.front();
      pending_.pop_front();
      const auto expected = size_of(in_flight_id_);
      in_flight_ = std::async(std::launch::async, [this, expected] {
        get_control c;
        c.cancel = &cancel_;
        return get_listed(*store_, in_flight_id_, in_flight_bytes_, c, expected);
      });
    }
    if (in_flight_.valid()) {
      if (in_flight_.wait_until(deadline) == std::future_status::timeout)
        return source_status::timed_out;  // still fetching: the caller decides whether to wait
      const get_status status = in_flight_.get();  // rethrows what the get threw
      if (status == get_status::found) {
        out.id = in_flight_id_;
        out.bytes = std::move(in_flight_bytes_);
        in_flight_bytes_ = {};
        delivered_.insert(out.id);
        ++gets_;
        return source_status::delivered;
      }
      missing_.push_back(in_flight_id_);  // listed but not gettable yet (eventual consistency)
      continue;
    }
    if (refill()) continue;
    // Nothing new listed; listed payloads that were absent are asked for again after the
    // poll interval (pending_ holds them), not at once.
    if (complete_ && pending_.empty()) return source_status::complete;
    if (protocol_clock::now() >= deadline) return source_status::timed_out;
    std::this_thread::sleep_for(poll_);
    ++polls_;
  }
}

template <payload_store Store>
bool store_source<Store>::refetch(const payload_id& id, std::vector<std::byte>& bytes) {
  get_control c;
  c.cancel = &cancel_;
  c.fresh = true;
  return get_listed(*store_, id, bytes, c, size_of(id)) == get_status::found;
}

template <payload_store Store>
std::uint64_t store_source<Store>::size_of(const payload_id& id) const {
  const auto it = sizes_.find(id);
  return it == sizes_.end() ? unknown_payload_size : it->second;
}

template <payload_store Store>
void store_source<Store>::close(const attempt_key& key) {
  if (key == key_) cancel_in_flight();
}

template <payload_store Store>
void store_source<Store>::cancel_in_flight() {
  if (!in_flight_.valid()) return;
  cancel_ = true;
  in_flight_.wait();
  in_flight_ = {};  // its outcome (an error, most likely "cancelled") is dropped
  in_flight_bytes_.clear();
  cancel_ = false;
}

template <payload_store Store>
bool store_source<Store>::refill() {
  const std::set<payload_id> absent(missing_.begin(), missing_.end());
  bool fresh = false;
  complete_ = detail::for_each_listed(store_->list(key_), owners_,
                                      [&](const payload_id& id, std::uint64_t bytes) {
    if (bytes != unknown_payload_size) sizes_[id] = bytes;
    if (delivered_.contains(id)) return;
    pending_.push_back(id);
    fresh = fresh || !absent.contains(id);
  });
  missing_.clear();
  return fresh;
}

template <payload_store Store>
prefetch_source<Store>::prefetch_source(Store& store, prefetch_options options)
    : store_(&store), options_(options) {
  DCR_EXPECTS(options_.parallel_gets >= 1, errc::invalid_argument,
              "prefetch_source: parallel_gets must be >= 1");
  if (options_.max_buffered == 0) options_.max_buffered = 2 * options_.parallel_gets;
  options_.max_buffered = std::max(options_.max_buffered, options_.parallel_gets);
  for (std::size_t i = 0; i < options_.parallel_gets; ++i)
    workers_.emplace_back([this] { work(); });
}

template <payload_store Store>
prefetch_source<Store>::~prefetch_source() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    cancel_->store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

template <payload_store Store>
void prefetch_source<Store>::open(const attempt_key& key, std::span<const std::uint32_t> owners) {
  std::lock_guard lock(mutex_);
  ++epoch_;
  cancel_->store(true);  // the previous attempt's gets still in flight
  cancel_ = std::make_shared<std::atomic<bool>>(false);
  key_ = key;
  owners_.assign(owners.begin(), owners.end());
  std::sort(owners_.begin(), owners_.end());
  scheduled_.clear();
  delivered_.clear();
  listed_.clear();
  sizes_.clear();
  queue_.clear();
  ready_.clear();
  missing_.clear();
  failure_ = nullptr;
  listing_complete_ = false;
  next_list_ = {};
  next_retry_ = {};
}

template <payload_store Store>
source_status prefetch_source<Store>::next(delivery& out, protocol_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (failure_) std::rethrow_exception(failure_);
    if (!ready_.empty()) {
      out = std::move(ready_.front());
      ready_.pop_front();
      delivered_.insert(out.id);
      ++gets_;
      wake_.notify_all();  // room for another get
      return source_status::delivered;
    }
    const auto now = protocol_clock::now();
    if (!missing_.empty() && now >= next_retry_) {
      for (const auto& id : missing_) queue_.push_back(id);
      missing_.clear();
      wake_.notify_all();
    }
    if (!listing_complete_ && queue_.empty() && now >= next_list_) {
      const auto epoch = epoch_;
      const auto key = key_;
      lock.unlock();
      std::vector<owner_listing> listing;
      std::exception_ptr failed;
      try {
        listing = store_->list(key);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed) std::rethrow_exception(failed);
      if (epoch != epoch_) continue;  // reopened meanwhile (by this thread: never)
      merge(listing);
      next_list_ = protocol_clock::now() + options_.poll_interval;
      ++polls_;
      continue;
    }
    if (listing_complete_ && queue_.empty() && in_flight_ == 0 && missing_.empty() &&
        std::includes(delivered_.begin(), delivered_.end(), listed_.begin(), listed_.end()))
      return source_status::complete;
    if (now >= deadline) return source_status::timed_out;
    auto until = deadline;
    if (!missing_.empty()) until = std::min(until, next_retry_);
    if (!listing_complete_ && queue_.empty()) until = std::min(until, next_list_);
    ready_or_failed_.wait_until(lock, until);
  }
}

template <payload_store Store>
bool prefetch_source<Store>::refetch(const payload_id& id, std::vector<std::byte>& bytes) {
  std::shared_ptr<std::atomic<bool>> cancel;
  std::uint64_t expected = unknown_payload_size;
  {
    std::lock_guard lock(mutex_);
    cancel = cancel_;
    if (const auto it = sizes_.find(id); it != sizes_.end()) expected = it->second;
  }
  get_control c;
  c.cancel = cancel.get();
  c.fresh = true;
  return get_listed(*store_, id, bytes, c, expected) == get_status::found;
}

template <payload_store Store>
void prefetch_source<Store>::close(const attempt_key& key) {
  std::lock_guard lock(mutex_);
  if (key != key_) return;
  ++epoch_;  // results still coming in are dropped
  cancel_->store(true);
  cancel_ = std::make_shared<std::atomic<bool>>(false);
  queue_.clear();
  ready_.clear();
  missing_.clear();
}

template <payload_store Store>
std::uint64_t prefetch_source<Store>::polls() const {
  std::lock_guard lock(mutex_);
  return polls_;
}

template <payload_store Store>
std::uint64_t prefetch_source<Store>::gets() const {
  std::lock_guard lock(mutex_);
  return gets_;
}

template <payload_store Store>
void prefetch_source<Store>::merge(const std::vector<owner_listing>& listing) {
  std::set<payload_id> listed;
  listing_complete_ = detail::for_each_listed(listing, owners_,
                                              [&](const payload_id& id, std::uint64_t bytes) {
    if (bytes != unknown_payload_size) sizes_[id] = bytes;
    listed.insert(id);
    if (scheduled_.insert(id).second) queue_.push_back(id);
  });
  if (listing_complete_) listed_ = std::move(listed);
  wake_.notify_all();
}

template <payload_store Store>
void prefetch_source<Store>::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] {
      return stop_ ||
             (!queue_.empty() && !failure_ && ready_.size() + in_flight_ < options_.max_buffered);
    });
    if (stop_) return;
    const payload_id id = queue_.front();
    queue_.pop_front();
    const auto sized = sizes_.find(id);
    const std::uint64_t expected = sized == sizes_.end() ? unknown_payload_size : sized->second;
    const auto epoch = epoch_;
    const auto cancel = cancel_;
    ++in_flight_;
    lock.unlock();
    delivery d;
    d.id = id;
    get_status status = get_status::absent;
    std::exception_ptr failed;
    try {
      get_control c;
      c.cancel = cancel.get();
      status = get_listed(*store_, id, d.bytes, c, expected);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    --in_flight_;
    if (epoch == epoch_) {
      if (failed) {
        if (!failure_) failure_ = failed;
      } else if (status == get_status::found) {
        ready_.push_back(std::move(d));
      } else {
        if (missing_.empty()) next_retry_ = protocol_clock::now() + options_.poll_interval;
        missing_.push_back(id);
      }
    }
    ready_or_failed_.notify_all();
    wake_.notify_all();
  }
}

}  // namespace dcr
