// dcr/protocol/payload_source.hpp: what a receiver agent reads payloads from, and the adapter
// that makes any pull store (dcr/protocol/payload_store.hpp) one.
//
// A payload source delivers the payloads of one attempt at a time, in any order, possibly more
// than once (the receiver deduplicates), as they become available. A push transport (the relay
// tree) implements it directly; store_source<Store> polls a pull store's listing. The source
// says `complete` once every expected owner's manifest is in and every payload it lists was
// delivered; a receiver that has applied everything then acknowledges.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <deque>
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

template <class S>
concept payload_source =
    std::same_as<typename S::payload_source_concept, payload_source_tag> &&
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

  void open(const attempt_key& key, std::span<const std::uint32_t> owners) {
    key_ = key;
    owners_.assign(owners.begin(), owners.end());
    std::sort(owners_.begin(), owners_.end());
    delivered_.clear();
    pending_.clear();
  }

  source_status next(delivery& out, protocol_clock::time_point deadline) {
    for (;;) {
      while (!pending_.empty()) {
        const payload_id id = pending_.front();
        pending_.pop_front();
        if (store_->get(id, out.bytes) == get_status::found) {
          out.id = id;
          delivered_.insert(id);
          ++gets_;
          return source_status::delivered;
        }
        missing_.push_back(id);  // listed but not gettable yet (an eventually consistent store)
      }
      if (refill()) continue;
      if (complete_ && missing_.empty()) return source_status::complete;
      if (protocol_clock::now() >= deadline) return source_status::timed_out;
      std::this_thread::sleep_for(poll_);
      ++polls_;
    }
  }

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes) {
    return store_->get(id, bytes) == get_status::found;
  }

  /// Listings made and gets issued since construction (both are store operations, never
  /// control-plane operations).
  [[nodiscard]] std::uint64_t polls() const noexcept { return polls_; }
  [[nodiscard]] std::uint64_t gets() const noexcept { return gets_; }

 private:
  // Lists the attempt; queues ids not delivered yet. Returns whether anything was queued.
  bool refill() {
    const auto listing = store_->list(key_);
    bool all_complete = true;
    std::size_t seen_owners = 0;
    for (const auto& l : listing) {
      if (!std::binary_search(owners_.begin(), owners_.end(), l.owner)) continue;
      ++seen_owners;
      all_complete = all_complete && l.complete;
      for (const auto& id : l.ids)
        if (!delivered_.contains(id)) pending_.push_back(id);
    }
    missing_.clear();
    complete_ = all_complete && seen_owners == owners_.size();
    return !pending_.empty();
  }

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

}  // namespace dcr
