// dcr/protocol/payload_source.hpp: what a receiver agent reads payloads from, and the adapter
// that makes any pull store (dcr/protocol/payload_store.hpp) one.
//
// A payload source delivers the payloads of one attempt at a time, in any order, possibly more
// than once (the receiver deduplicates), as they become available. A push transport (the relay
// tree) implements it directly; store_source<Store> polls a pull store's listing. The source
// says `complete` once every expected owner's manifest is in and every payload it lists was
// delivered; a receiver that has applied everything then acknowledges. prefetch_source does
// what store_source does with several gets in flight at once (object storage, where one get at
// a time leaves most of a link idle).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace dcr {

/// Opt-in tag: a payload source declares `using payload_source_concept = dcr::payload_source_tag;`.
struct payload_source_tag {};

/// One delivered payload.
struct delivery {
  payload_id id;
  std::vector<std::byte> bytes;
};

/// What next() did.
enum class source_status {
  delivered,  ///< `out` holds a payload
  complete,   ///< everything of the attempt was delivered
  timed_out,  ///< nothing new before the deadline (call again, or give up)
};

namespace detail {

/// Calls `each(id)` for every id `listing` holds of an owner in `owners` (sorted); returns
/// whether every one of `owners` is listed with its manifest in (the attempt is fully listed).
template <class F>
bool for_each_listed(const std::vector<owner_listing>& listing, std::span<const std::uint32_t> owners,
                     F&& each) {
  bool all_complete = true;
  std::size_t seen_owners = 0;
  for (const auto& l : listing) {
    if (!std::binary_search(owners.begin(), owners.end(), l.owner)) continue;
    ++seen_owners;
    all_complete = all_complete && l.complete;
    for (const auto& id : l.ids) each(id);
  }
  return all_complete && seen_owners == owners.size();
}

}  // namespace detail

template <class S>
concept payload_source =
    std::derived_from<typename S::payload_source_concept, payload_source_tag> &&
    requires(S& s, const attempt_key& key, std::span<const std::uint32_t> owners, delivery& out,
             protocol_clock::time_point deadline, const payload_id& id,
             std::vector<std::byte>& bytes) {
      s.open(key, owners);                // deliver this attempt, from these owners, from now on
      { s.next(out, deadline) } -> std::same_as<source_status>;
      { s.refetch(id, bytes) } -> std::same_as<bool>;  // a fresh copy (false: gone)
    };

/// A source that holds payloads on its receiver's behalf (a push transport: a relay node
/// acknowledges a payload only once its receivers took it) is told when the receiver is done
/// with an attempt, whatever the outcome (applied, failed or fenced): it will take nothing more
/// of it. The receiver agent calls close(key) at the end of every attempt when the source has it.
template <class S>
concept closable_source = payload_source<S> && requires(S& s, const attempt_key& key) { s.close(key); };

/// A payload source over any pull store: lists the attempt, gets what is new, and polls
/// (every `poll_interval`) when nothing is. Not thread-safe (one receiver agent uses it).
template <payload_store Store>
class store_source {
 public:
  using payload_source_concept = payload_source_tag;

  explicit store_source(Store& store,
                        std::chrono::milliseconds poll_interval = std::chrono::milliseconds(2))
      : store_(&store), poll_(poll_interval) {}

  void open(const attempt_key& key, std::span<const std::uint32_t> owners);

  source_status next(delivery& out, protocol_clock::time_point deadline);

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes);

  /// Listings made and gets issued since construction (both are store operations, never
  /// control-plane operations).
  [[nodiscard]] std::uint64_t polls() const noexcept { return polls_; }
  [[nodiscard]] std::uint64_t gets() const noexcept { return gets_; }

 private:
  // Lists the attempt; queues ids not delivered yet. Returns whether an id was queued that
  // was not absent at its last get (one that was waits for the next poll).
  bool refill();

  Store* store_;
  std::chrono::milliseconds poll_;
  attempt_key key_{};
  std::vector<std::uint32_t> owners_;
  std::set<payload_id> delivered_;
  std::deque<payload_id> pending_;
  std::vector<payload_id> missing_;
  bool complete_ = false;
  std::uint64_t polls_ = 0, gets_ = 0;
};

/// How a prefetch_source fetches.
struct prefetch_options {
  std::size_t parallel_gets = 4;  ///< gets in flight at once (worker threads), >= 1
  /// Payloads fetched (or being fetched) but not yet taken by next(), at most; 0: twice
  /// parallel_gets. Bounds the source's memory to that many payloads.
  std::size_t max_buffered = 0;
  /// Wait between listings while the attempt is not complete and nothing new is listed, and
  /// before a listed payload that was absent is asked for again.
  std::chrono::milliseconds poll_interval{10};
};

/// A payload source over any thread-safe pull store that keeps up to `parallel_gets` gets in
/// flight: the calling thread lists the attempt (at most once per poll interval, and only while
/// there is nothing left to fetch and the listing is not complete yet); worker threads get the
/// listed payloads, at most `max_buffered` ahead of next(). Deliveries come in completion
/// order. A listed payload that is absent (not visible yet in an eventually consistent store,
/// or not forwarded yet by a fan-out) is asked for again after a poll interval. A get or list
/// that throws fails the source: next() rethrows that error (until the next open()). open()
/// abandons the previous attempt: gets still in flight finish, and their results are dropped.
/// next(), open() and refetch() are for one thread (one receiver agent); the workers are
/// joined by the destructor.
template <payload_store Store>
class prefetch_source {
 public:
  using payload_source_concept = payload_source_tag;

  explicit prefetch_source(Store& store, prefetch_options options = {});
  prefetch_source(const prefetch_source&) = delete;
  prefetch_source& operator=(const prefetch_source&) = delete;
  ~prefetch_source();

  void open(const attempt_key& key, std::span<const std::uint32_t> owners);

  source_status next(delivery& out, protocol_clock::time_point deadline);

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes);

  /// Listings made and payloads delivered since construction.
  [[nodiscard]] std::uint64_t polls() const;
  [[nodiscard]] std::uint64_t gets() const;

 private:
  // Queues what the listing adds; notes whether every expected owner is complete.
  void merge(const std::vector<owner_listing>& listing);

  void work();

  Store* store_;
  prefetch_options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;             // workers: something to fetch, room, or stop
  std::condition_variable ready_or_failed_;  // next(): a result came in
  std::vector<std::thread> workers_;
  std::uint64_t epoch_ = 0;
  attempt_key key_{};
  std::vector<std::uint32_t> owners_;
  std::set<payload_id> scheduled_, delivered_, listed_;
  std::deque<payload_id> queue_;
  std::deque<delivery> ready_;
  std::vector<payload_id> missing_;
  std::size_t in_flight_ = 0;
  std::exception_ptr failure_;
  bool listing_complete_ = false;
  bool stop_ = false;
  protocol_clock::time_point next_list_{}, next_retry_{};
  std::uint64_t polls_ = 0, gets_ = 0;
};

}  // namespace dcr

#include "dcr/detail/protocol/payload_source.inl"
