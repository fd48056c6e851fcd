// dcr/protocol/relay/relay_owner.hpp: the trainer end of the relay (dcr/protocol/relay/relay.hpp): the
// payload sink an owner agent puts into. It streams each payload across the cluster boundary
// to one of the roots (striped), and its manifest completes only once every payload was
// delivered to every receiver the attempt requires.
//
// Per attempt (the owner agent calls these in this order, from one thread at a time):
//   open_attempt(key, receivers, deadline)
//                                 connects to every root that is not connected (retrying an
//                                 unreachable one until connect_timeout or the attempt's
//                                 deadline, whichever is first; a TLS refusal fails at once),
//                                 announces the attempt and waits until every root
//                                 answers that the required receivers are reachable (a root
//                                 lost meanwhile fails the attempt at once)
//   put(id, bytes)                streams the payload to root root_of(id) in chunks of at most
//                                 chunk_bytes as the root's credit allows, booking every frame on
//                                 that root's cross-cluster flow in 64 KiB pieces as it goes out;
//                                 returns once the last chunk is queued (the bytes are copied)
//   put_manifest(key, owner, ids) sends the manifest through root manifest_root_of(owner) and
//                                 waits until every root acknowledged every payload it carried
//                                 and the manifest: delivered to the receivers, not queued
// Striping is by payload: payload (owner o, sequence s) goes to root (o + s) mod R, so every
// owner's payloads spread over every root (and so over every cross-cluster flow) whatever the
// number of owners, and each payload crosses the boundary once per attempt.
//
// Every wait of an attempt (ready, credit, acknowledgements) ends at the attempt's deadline, when
// the coordinator fails the attempt anyway; slow receivers legitimately hold credit and
// acknowledgements back until then. Failures are errc::transport_failure naming the root (and,
// through it, the node or receiver): a root that cannot be reached or refuses this peer, a root
// lost mid-attempt (any root: its connection dropped, or it was silent past the heartbeat
// timeout; the attempt fails at once, since what any owner streamed through it is lost), a
// nack, or the deadline. A later open_attempt reconnects to lost roots. Putting an id again in the same attempt is a
// no-op with equal bytes and an error with other bytes, as in every store.
#pragma once

#include <xxhash.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "dcr/config.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/link_shaper.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "dcr/protocol/relay/relay_link.hpp"

namespace dcr {

struct relay_owner_options {
  std::vector<relay_endpoint> roots;  ///< every root, in the deployment's order (striping uses it)
  relay_tls tls;                      ///< this owner's identity and the deployment's CA
  /// flows[r]: the cross-cluster flow the connection to root r books its bytes on (null or
  /// missing: not shaped, not counted). Shared flows may be shared between owners.
  std::vector<link_shaper*> flows;
  std::size_t chunk_bytes = std::size_t{1} << 20;  ///< cut-through unit (at most the root's window)
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds handshake_timeout{10000};
  relay_heartbeat heartbeat;  ///< on every root connection: a frozen root fails the attempt
  std::string name = "relay owner";  ///< for messages
};

/// Counters of an owner's relay since it was made.
struct relay_owner_stats {
  std::vector<std::uint64_t> bytes_sent;  ///< per root: frame bytes sent (booked on its flow)
  std::uint64_t payloads = 0;             ///< payloads streamed
  std::uint64_t connects = 0;             ///< connections established (reconnections included)
};

class relay_owner_store {
 public:
  using payload_store_concept = payload_sink_tag;

  explicit relay_owner_store(relay_owner_options options);
  relay_owner_store(const relay_owner_store&) = delete;
  relay_owner_store& operator=(const relay_owner_store&) = delete;
  ~relay_owner_store();

  /// The root a payload is streamed to, and the root an owner's manifest goes through.
  static std::size_t root_of(const payload_id& id, std::size_t roots) noexcept;
  static std::size_t manifest_root_of(std::uint32_t owner, std::size_t roots) noexcept { return owner % roots; }

  void open_attempt(const attempt_key& key, std::span<const std::string> receivers,
                    protocol_clock::time_point deadline);

  void put(const payload_id& id, std::span<const std::byte> bytes);

  void put_manifest(const attempt_key& key, std::uint32_t owner, std::span<const payload_id> ids);

  [[nodiscard]] relay_owner_stats stats() const;

 private:
  struct root_state {
    relay_endpoint at;
    std::shared_ptr<relay_link> link;  // set under mutex_, used on the io thread
    bool alive = false;
    std::string error;          // why it is not alive
    std::int64_t credit = 0;    // chunk bytes it lets this owner send
    std::uint64_t chunk = 0;    // chunk size on this connection
    bool ready = false;         // answered ready for key_
    std::uint64_t carrying = 0; // payloads (and manifest) of key_ sent through it
  };

  void throw_if_failed() const;
  void throw_if_lost(const root_state& r) const;

  // Waits (mutex held, released while waiting) until done() or a failure; done() may throw.
  // Ends with errc::transport_failure at the attempt's deadline.
  template <class Done>
  void wait(std::unique_lock<std::mutex>& lock, const std::string& what, Done done) {
    for (;;) {
      throw_if_failed();
      if (done()) return;
      const auto seen = progress_;
      if (wake_.wait_until(lock, deadline_, [&] { return progress_ != seen; })) continue;
      throw_if_failed();
      if (done()) return;
      throw error(errc::transport_failure, options_.name + ": the deadline of " + relay_wire::describe(*key_) +
                                               " passed waiting for " + what);
    }
  }

  // Connects to root r unless connected: an unreachable root is retried until connect_timeout
  // or the attempt's deadline (each try bounded by what is left of both); a refusal fails at
  // once.
  void connect(std::size_t r, std::unique_lock<std::mutex>& lock);

  void attach(std::size_t r, std::shared_ptr<relay_link> link, std::unique_lock<std::mutex>& lock);

  // Books the frame on root r's flow, then queues it (mutex released while booking).
  void send(std::size_t r, relay_wire::frame_ptr frame, std::unique_lock<std::mutex>& lock);

  // ---- io thread

  void on_lost(std::size_t r, const std::weak_ptr<relay_link>& weak, const std::string& why);

  void on_frame(std::size_t r, const std::weak_ptr<relay_link>& weak, relay_frame type, const relay_wire::frame_ptr& frame);

  relay_owner_options options_;
  asio::ssl::context ctx_;
  relay_detail::io_thread io_;  // stopped by the destructor before the state it touches goes
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<root_state> roots_;
  std::optional<attempt_key> key_;
  protocol_clock::time_point deadline_{};
  std::map<payload_id, std::uint64_t> sent_;  // id -> hash of its bytes
  std::set<payload_id> acked_;
  std::uint32_t manifest_owner_ = 0;
  bool manifest_acked_ = false;
  std::string failure_;
  std::uint64_t progress_ = 0;  // frames heard from any root, or roots lost
  relay_owner_stats stats_;
};

static_assert(payload_sink<relay_owner_store>);
static_assert(attempt_routed_sink<relay_owner_store>);

}  // namespace dcr

#include "dcr/detail/protocol/relay/relay_owner.inl"
