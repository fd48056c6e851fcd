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
//
// Neither adapter runs a get on the caller's thread: next() returns timed_out at its deadline
// even while a get is in flight, so the receiver agent sees its attempt deadline and a fence on
// time; close(key) (which the receiver calls at the end of every attempt), open() and the
// destructor cancel the gets in flight and wait for them. A store that takes a get_control
// (controllable_store: s3_payload_store, fanout_store) ends a cancelled get at once; any other
// store's get runs to its end.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <memory>
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

/// A payload size no manifest gave (what get_listed and for_each_listed pass then).
inline constexpr std::uint64_t unknown_payload_size = UINT64_MAX;

namespace detail {

/// Calls `each(id, bytes)` for every id `listing` holds of an owner in `owners` (sorted):
/// `bytes` is the payload's size where the listing records it (owner_listing::sizes), else
/// unknown_payload_size.
/// Returns whether every one of `owners` is listed with its manifest in (the attempt is fully
/// listed).
template <class F>
bool for_each_listed(const std::vector<owner_listing>& listing, std::span<const std::uint32_t> owners,
                     F&& each) {
  bool all_complete = true;
  std::size_t seen_owners = 0;
  for (const auto& l : listing) {
    if (!std::binary_search(owners.begin(), owners.end(), l.owner)) continue;
    ++seen_owners;
    all_complete = all_complete && l.complete;
    const bool sized = l.sizes.size() == l.ids.size();
    for (std::size_t i = 0; i < l.ids.size(); ++i)
      each(l.ids[i], sized ? l.sizes[i] : unknown_payload_size);
  }
  return all_complete && seen_owners == owners.size();
}

}  // namespace detail

/// How one get may be bounded and interrupted, for stores that take it (controllable_store).
struct get_control {
  /// Once set (by any thread), the get ends soon (within about a second) by throwing
  /// errc::transport_failure; nothing is returned.
  const std::atomic<bool>* cancel = nullptr;
  /// Past it the get throws errc::deadline_exceeded.
  protocol_clock::time_point deadline = protocol_clock::time_point::max();
  /// A payload larger than this is refused (errc::transport_failure); 0: the store's own cap.
  std::uint64_t max_bytes = 0;
  /// A copy from the origin, not from a cache in between (a fanout_store downloads again):
  /// what a refetch after a failed apply asks for.
  bool fresh = false;
};

/// A pull store whose get also takes a get_control.
template <class S>
concept controllable_store =
    payload_store<S> && requires(const S& s, const payload_id& id, std::vector<std::byte>& out,
                                 const get_control& c) {
      { s.get(id, out, c) } -> std::same_as<get_status>;
    };

/// store.get(id, out, control) where the store takes it, else store.get(id, out).
template <payload_store Store>
get_status get_with(const Store& store, const payload_id& id, std::vector<std::byte>& out,
                    const get_control& control) {
  if constexpr (controllable_store<Store>)
    return store.get(id, out, control);
  else
    return store.get(id, out);
}

/// get_with for a payload whose manifest says it is `expected_bytes` long (or
/// unknown_payload_size): that size caps the get (a controllable store refuses a longer body as it arrives), and a payload
/// found with any other length throws errc::transport_failure naming the payload and both
/// sizes (a body cut short or replaced; it is never handed to the receiver).
template <payload_store Store>
get_status get_listed(const Store& store, const payload_id& id, std::vector<std::byte>& out,
                      get_control control, std::uint64_t expected_bytes);

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

/// A payload source over any pull store: lists the attempt, gets what is new (one get at a
/// time, on a thread of its own, so that next() keeps its deadline), and polls (every
/// `poll_interval`) when nothing is. refetch() asks for a fresh copy (get_control::fresh).
/// Not thread-safe (one receiver agent uses it; refetch may run beside next).
template <payload_store Store>
class store_source {
 public:
  using payload_source_concept = payload_source_tag;

  explicit store_source(Store& store,
                        std::chrono::milliseconds poll_interval = std::chrono::milliseconds(2))
      : store_(&store), poll_(poll_interval) {}
  store_source(const store_source&) = delete;
  store_source& operator=(const store_source&) = delete;
  ~store_source() { cancel_in_flight(); }

  void open(const attempt_key& key, std::span<const std::uint32_t> owners);

  source_status next(delivery& out, protocol_clock::time_point deadline);

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes);

  /// The receiver is done with attempt `key`: a get in flight is cancelled and waited for.
  void close(const attempt_key& key);

  /// Listings made and gets issued since construction (both are store operations, never
  /// control-plane operations).
  [[nodiscard]] std::uint64_t polls() const noexcept { return polls_; }
  [[nodiscard]] std::uint64_t gets() const noexcept { return gets_; }

 private:
  // Lists the attempt; queues ids not delivered yet. Returns whether an id was queued that
  // was not absent at its last get (one that was waits for the next poll).
  bool refill();

  // What the manifest says of `id`'s size, or unknown_payload_size.
  [[nodiscard]] std::uint64_t size_of(const payload_id& id) const;

  void cancel_in_flight();

  Store* store_;
  std::chrono::milliseconds poll_;
  std::atomic<bool> cancel_{false};
  std::future<get_status> in_flight_;  // the get of in_flight_id_ into in_flight_bytes_
  payload_id in_flight_id_{};
  std::vector<std::byte> in_flight_bytes_;
  attempt_key key_{};
  std::vector<std::uint32_t> owners_;
  std::set<payload_id> delivered_;
  std::deque<payload_id> pending_;
  std::vector<payload_id> missing_;
  std::map<payload_id, std::uint64_t> sizes_;  // what the manifests say, where they say it
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
/// and close(key) abandon the attempt: gets still in flight are cancelled (a controllable
/// store's end at once, others finish) and their results dropped. refetch() asks for a fresh
/// copy (get_control::fresh). next(), open(), close() and refetch() are for one receiver
/// agent; the workers are joined by the destructor, which cancels their gets first.
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

  /// The receiver is done with attempt `key` (if it is the open one): gets in flight are
  /// cancelled, nothing more of it is fetched.
  void close(const attempt_key& key);

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
  // The open attempt's cancellation flag, replaced (the old one set) by open() and close().
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  attempt_key key_{};
  std::vector<std::uint32_t> owners_;
  std::set<payload_id> scheduled_, delivered_, listed_;
  std::map<payload_id, std::uint64_t> sizes_;  // what the manifests say, where they say it
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
