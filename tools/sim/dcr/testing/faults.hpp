// dcr/testing/faults.hpp: fault injection for tests and `dcr simulate`, as decorators of the
// production policy types; nothing in the production agents knows about faults.
//
//   faulty_source<Source>   a payload source that duplicates, corrupts, delays, reorders,
//                           drops or silently loses deliveries, or delivers a payload of an
//                           earlier (fenced) attempt after the retry began
//   control_plane_outage    a window of time in which a decorated control plane is unreachable
//   outage_plane<Plane>     a control plane whose every operation throws
//                           control_plane_unavailable while its outage is active
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "dcr/error.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/in_process.hpp"
#include "dcr/protocol/payload_source.hpp"

namespace dcr::testing {

/// What to do with one delivery.
enum class delivery_fault {
  none,
  duplicate,  ///< deliver the same bytes twice (must be dropped as a duplicate)
  corrupt,    ///< flip one byte of the delivered copy (refused, then fetched again)
  drop,       ///< the source fails (the receiver fails the attempt, the retry repairs it)
  delay,      ///< deliver 300 ms late
  reorder,    ///< hold it back and deliver it after the next one
  stale,      ///< also deliver, later, a kept payload of an earlier attempt (refused as stale)
  lose,       ///< the delivery vanishes and the source still reports `complete` (a transport
              ///< bug: the receiver acknowledges without it; the coordinator must notice)
};

/// Chooses the fault of the k-th delivery (0-based) of an attempt.
using fault_choice = std::function<delivery_fault(const attempt_key&, std::uint64_t ordinal)>;

/// Without a choice (an empty fault_choice) it is a pass-through: every call goes to the inner
/// source as it is, and no delivery is copied or held.
template <payload_source Source>
class faulty_source {
 public:
  using payload_source_concept = payload_source_tag;

  faulty_source(Source& inner, fault_choice choice) : inner_(&inner), choice_(std::move(choice)) {}

  void open(const attempt_key& key, std::span<const std::uint32_t> owners) {
    if (!choice_) return inner_->open(key, owners);
    if (key != key_ && !last_.bytes.empty() && key.base_version == key_.base_version)
      stale_ = last_;  // a payload of the attempt being replaced, to be delivered late
    key_ = key;
    ordinal_ = 0;
    held_.reset();
    replay_.reset();
    inner_->open(key, owners);
  }

  source_status next(delivery& out, protocol_clock::time_point deadline) {
    if (!choice_) return inner_->next(out, deadline);
    if (replay_) {
      out = std::move(*replay_);
      replay_.reset();
      return source_status::delivered;
    }
    auto status = inner_->next(out, deadline);
    if (status == source_status::complete && held_) {
      out = std::move(*held_);
      held_.reset();
      return source_status::delivered;
    }
    if (status != source_status::delivered) return status;
    last_ = out;
    const auto fault = choice_(key_, ordinal_);
    ++ordinal_;
    switch (fault) {
      case delivery_fault::none: break;
      case delivery_fault::duplicate: replay_ = out; break;
      case delivery_fault::corrupt:
        if (!out.bytes.empty()) out.bytes[(ordinal_ * 7919) % out.bytes.size()] ^= std::byte{0x20};
        break;
      case delivery_fault::drop:
        throw error(errc::transport_failure, "faulty_source: delivery " + std::to_string(ordinal_ - 1) +
                                                 " of attempt " + to_string(key_) +
                                                 " dropped (injected)");
      case delivery_fault::lose: return next(out, deadline);  // as if it never came
      case delivery_fault::delay: std::this_thread::sleep_for(std::chrono::milliseconds(300)); break;
      case delivery_fault::reorder: {
        delivery later = std::move(out);
        status = inner_->next(out, deadline);
        if (status != source_status::delivered) {
          out = std::move(later);
          return source_status::delivered;
        }
        // A payload held back by an earlier reorder goes out next: held_ keeps one at a time.
        if (held_) replay_ = std::move(*held_);
        held_ = std::move(later);
        break;
      }
      case delivery_fault::stale:
        if (!stale_.bytes.empty()) {
          replay_ = std::move(stale_);
          stale_ = {};
        }
        break;
    }
    if (held_ && fault != delivery_fault::reorder) {
      replay_ = std::move(*held_);
      held_.reset();
    }
    return source_status::delivered;
  }

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes) {
    return inner_->refetch(id, bytes);
  }
  void close(const attempt_key& key)
    requires closable_source<Source>
  {
    inner_->close(key);
  }

 private:
  Source* inner_;
  fault_choice choice_;
  attempt_key key_{~0ull, ~0ull, ~0u};
  std::uint64_t ordinal_ = 0;
  delivery last_, stale_;
  std::optional<delivery> held_, replay_;
};

/// Chooses the fault of delivery `ordinal` of refit attempt `attempt` to receiver `receiver`
/// (the in-process driver's receivers, by index).
using receiver_fault_plan =
    std::function<delivery_fault(std::uint32_t attempt, std::size_t receiver, std::uint64_t ordinal)>;

/// A source_decorator for dcr::in_process_refit that applies `plan` (none when empty).
inline source_decorator decorate_with(receiver_fault_plan plan) {
  if (!plan) return {};
  return [plan](std::size_t receiver, payload_source_base& inner) -> std::unique_ptr<payload_source_base> {
    struct forward {
      using payload_source_concept = payload_source_tag;
      payload_source_base* inner;
      void open(const attempt_key& k, std::span<const std::uint32_t> o) { inner->open(k, o); }
      source_status next(delivery& d, protocol_clock::time_point t) { return inner->next(d, t); }
      bool refetch(const payload_id& id, std::vector<std::byte>& b) { return inner->refetch(id, b); }
    };
    struct wrapped {
      using payload_source_concept = payload_source_tag;
      forward fwd;
      faulty_source<forward> faulty;
      wrapped(payload_source_base& in, fault_choice c) : fwd{&in}, faulty(fwd, std::move(c)) {}
      void open(const attempt_key& k, std::span<const std::uint32_t> o) { faulty.open(k, o); }
      source_status next(delivery& d, protocol_clock::time_point t) { return faulty.next(d, t); }
      bool refetch(const payload_id& id, std::vector<std::byte>& b) { return faulty.refetch(id, b); }
    };
    auto choice = [plan, receiver](const attempt_key& key, std::uint64_t ordinal) {
      return key.base_version == key.target_version ? delivery_fault::none
                                                    : plan(key.number, receiver, ordinal);
    };
    return std::make_unique<erased_source<wrapped>>(inner, choice);
  };
}

/// A switch shared by outage_plane decorators: while on, their operations fail.
class control_plane_outage {
 public:
  void begin() noexcept { on_ = true; }
  void end() noexcept { on_ = false; }
  [[nodiscard]] bool active() const noexcept { return on_.load(); }
  /// On for `length` from now, from a thread of its own (detached).
  void for_duration(std::chrono::milliseconds length) {
    begin();
    std::thread([this, length] {
      std::this_thread::sleep_for(length);
      end();
    }).detach();
  }

 private:
  std::atomic<bool> on_{false};
};

template <control_plane Plane>
class outage_plane {
 public:
  using control_plane_concept = control_plane_tag;
  outage_plane(Plane& inner, const control_plane_outage& outage) : inner_(&inner), outage_(&outage) {}

  std::optional<control_record> get(const std::string& k) { check("get", k); return inner_->get(k); }
  std::vector<control_record> list(const std::string& p) { check("list", p); return inner_->list(p); }
  bool transact(std::span<const key_compare> c, std::span<const key_write> w) {
    check("transact", w.empty() ? std::string("-") : w.front().key);
    return inner_->transact(c, w);
  }
  std::int64_t revision() { check("revision", "-"); return inner_->revision(); }
  std::int64_t wait_for_change(const std::string& p, std::int64_t after, protocol_clock::time_point d) {
    check("wait", p);
    return inner_->wait_for_change(p, after, d);
  }
  lease_id grant_lease(std::chrono::seconds ttl) { check("grant_lease", "-"); return inner_->grant_lease(ttl); }
  bool keep_alive(lease_id l) { check("keep_alive", "-"); return inner_->keep_alive(l); }
  void revoke(lease_id l) { check("revoke", "-"); inner_->revoke(l); }

 private:
  void check(const char* op, const std::string& key) const {
    if (outage_->active())
      throw error(errc::control_plane_unavailable,
                  std::string("outage_plane: ") + op + " '" + key + "': injected outage");
  }
  Plane* inner_;
  const control_plane_outage* outage_;
};

}  // namespace dcr::testing
