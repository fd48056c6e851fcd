// dcr/protocol/relay/relay_node.hpp: the rollout-node end of the relay (dcr/protocol/relay/relay.hpp): it
// accepts roots (mutual TLS), assembles the payloads they forward, and hands them to the
// receivers of its node, each through a relay_node::source (a payload_source).
//
// Delivery and acknowledgement. A root announces each attempt with the receivers it requires
// before forwarding any of its payloads; the node then expects every required receiver that is
// attached to it. A payload is acknowledged to the root that carried it once every expected
// receiver has taken it from its source (next() returned it), not when it arrived; a manifest
// once every payload it lists was acknowledged here. A required receiver that ends the attempt
// (source close(): applied, failed or fenced) or detaches before taking a payload makes that
// payload's answer a nack naming it. An attempt announced later than the current one replaces
// it: what the node held of the old one is dropped (its late payloads are never delivered).
//
// Memory. A root reserves a payload's whole size on the node before forwarding its first chunk
// and the node returns that credit when the payload is released (taken by every expected
// receiver, or dropped), so the payloads held for one root connection never exceed the window
// the node granted it in its hello, except that a single payload larger than the window is
// admitted when nothing else of that root is held; no payload larger than max_payload_bytes is
// ever sized here (it is nacked and its credit returned). Delivered payloads are kept for refetch up to
// refetch_bytes (oldest dropped first; a refetch of a dropped one answers false).
//
// Failures. A root connection lost while a payload of the current attempt was still arriving
// from it breaks the attempt here: the sources of its receivers throw errc::transport_failure
// naming the root from next(). Every wait in next() ends at its deadline.
//
// Hostile peers. Only certificates granting the role root connect (dcr/protocol/relay/relay_link.hpp);
// every count in a frame is checked against the frame's bytes and the protocol's limits before
// anything is sized by it, and a root that overruns its window is disconnected.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "dcr/config.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/relay/relay_link.hpp"

namespace dcr {

struct relay_node_options {
  relay_endpoint listen;  ///< where roots connect (port 0: any free port, see endpoint())
  relay_tls tls;          ///< this node's identity and the deployment's CA
  /// Payload bytes one root connection may have held here at a time (see the file comment).
  std::uint64_t window_bytes = std::uint64_t{256} << 20;
  /// Delivered payloads kept for refetch (bytes).
  std::uint64_t refetch_bytes = std::uint64_t{64} << 20;
  std::chrono::milliseconds handshake_timeout{10000};
  /// The largest payload it assembles (a larger one is nacked without being sized here).
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  relay_heartbeat heartbeat;          ///< on every root connection
  relay_accept_limits accept_limits;  ///< pending handshakes of roots
  std::string name = "relay node";  ///< for messages
  /// Called (on the node's io thread) with every refused peer and every lost root connection.
  std::function<void(const std::string&)> log;
};

/// Counters of a node since it started.
struct relay_node_stats {
  std::uint64_t payloads_received = 0;  ///< complete payloads assembled
  std::uint64_t bytes_received = 0;     ///< payload bytes assembled
  std::uint64_t deliveries = 0;         ///< payloads handed to receivers (one per receiver)
  std::uint64_t held_bytes = 0;         ///< payload bytes held now
  std::uint64_t peak_held_bytes = 0;    ///< the most held at once
  std::uint64_t dropped_stale = 0;      ///< payloads of replaced attempts dropped
  std::uint64_t refusals = 0;           ///< peers refused at connection
};

class relay_node {
 public:
  class source;

  /// Listens at once; throws errc::transport_failure if it cannot, errc::invalid_argument if
  /// the TLS files cannot be used.
  explicit relay_node(relay_node_options options);
  relay_node(const relay_node&) = delete;
  relay_node& operator=(const relay_node&) = delete;
  /// Closes every connection (roots see the node lost). Sources must be destroyed first.
  ~relay_node();

  /// Where roots connect.
  [[nodiscard]] const relay_endpoint& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] relay_node_stats stats() const;
  /// The refusals so far (at most the last 64), each naming the peer and the reason.
  [[nodiscard]] std::vector<std::string> refusals() const;
  /// Root connections established now.
  [[nodiscard]] std::size_t roots_connected() const;

 private:
  struct root_conn {
    std::shared_ptr<relay_link> link;  // io thread only
    std::string peer;
    std::uint64_t outstanding = 0;     // bytes reserved by the root and not credited back
    std::set<payload_id> discarding;   // payloads whose remaining chunks are ignored
  };
  // A payload's bytes here. One that came whole in a single chunk frame (the usual case: chunks
  // are 1 MiB, buckets smaller) is that frame itself, kept as it was read, with no copy and no
  // second buffer; a larger one is assembled chunk by chunk into a buffer of its size.
  struct payload_bytes {
    std::shared_ptr<const void> keep;  // owns the memory
    const std::byte* data = nullptr;
    std::uint64_t size = 0;
    explicit operator bool() const noexcept { return keep != nullptr; }
  };
  struct held_payload {
    payload_bytes bytes;
    std::byte* fill = nullptr;  // the buffer being assembled (null when the frame is kept)
    std::uint64_t received = 0;
    bool complete = false;
    std::shared_ptr<root_conn> from;
    std::set<std::string> pending;  // expected receivers that have not taken it
    std::string failure;            // why some expected receiver will not have it
  };
  struct manifest_state {
    std::vector<payload_id> ids;
    std::shared_ptr<root_conn> from;
    bool answered = false;
  };
  struct source_state {
    std::string name;
    std::optional<attempt_key> opened;
    std::vector<std::uint32_t> owners;
    std::set<payload_id> taken;
    std::size_t cursor = 0;             // into arrival_ of the current attempt
    std::optional<attempt_key> closed;  // ended by its receiver
  };
  using outbox = std::vector<std::pair<std::shared_ptr<root_conn>, relay_wire::frame_ptr>>;

  // ---- io thread

  void refused(const std::string& why);

  void on_root(std::shared_ptr<relay_link> link);

  void on_lost(const std::shared_ptr<root_conn>& c, const std::string& why);

  void on_frame(const std::shared_ptr<root_conn>& c, relay_frame type, const relay_wire::frame_ptr& frame);

  // ---- state changes (mutex held)

  void announce(const attempt_key& key, std::vector<std::string> required, outbox& out);

  void receive(const std::shared_ptr<root_conn>& c, const relay_wire::frame_ptr& frame,
               const relay_wire::chunk_view& chunk, outbox& out);

  static void note_failure(held_payload& h, const std::string& why);

  void release_bytes(held_payload& h);

  // Every expected receiver has taken (or will not take) the payload: answer the root, return
  // its credit, keep it for refetch.
  void release(std::map<payload_id, held_payload>::iterator it, outbox& out);

  void answer_manifests(outbox& out);

  // Posts frames to the io thread (from a receiver's thread).
  void post(outbox out);

  std::vector<std::string> attached_names();
  void broadcast_receivers();

  // ---- the receiver side (called by sources)

  void attach(source_state* s);

  void detach(source_state* s);

  // `name` will take nothing more of the current attempt.
  void give_up(const std::string& name, const std::string& why, outbox& out);

  void open(source_state& s, const attempt_key& key, std::span<const std::uint32_t> owners);

  void close(source_state& s, const attempt_key& key);

  source_status next(source_state& s, delivery& out, protocol_clock::time_point deadline);

  bool complete_for(const source_state& s) const;

  payload_bytes cached(const payload_id& id) const;

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes);

  relay_node_options options_;
  asio::ssl::context ctx_;
  relay_detail::io_thread io_;
  std::unique_ptr<relay_detail::listener> listener_;
  relay_endpoint endpoint_;
  std::vector<std::shared_ptr<root_conn>> conns_;  // io thread only

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<attempt_key> current_;
  std::set<std::string> required_, expect_, gone_;
  std::map<std::string, source_state*> sources_;
  std::map<payload_id, held_payload> held_;
  std::map<std::uint32_t, manifest_state> manifests_;
  std::vector<payload_id> arrival_;  // completed payloads of the current attempt, in order
  std::set<payload_id> delivered_ok_;
  std::map<payload_id, std::string> failed_;
  std::deque<std::pair<payload_id, payload_bytes>> cache_;
  std::uint64_t cache_bytes_ = 0;
  std::string failure_;  // the current attempt cannot complete here
  relay_node_stats stats_;
  std::deque<std::string> refusals_;
  std::size_t live_roots_ = 0;

 public:
  /// The payload source of one receiver attached to the node (named as the receiver agent is,
  /// e.g. "r3"): delivers the payloads of the attempt it was opened for, as they arrive, each
  /// once; complete once every expected owner's manifest is here and every payload it lists was
  /// delivered. close(key) says the receiver is done with that attempt. Constructing it
  /// attaches the receiver (roots learn it is reachable here), destroying it detaches it. One
  /// thread uses a source; sources of one node may be used concurrently.
  class source {
   public:
    using payload_source_concept = payload_source_tag;
    source(relay_node& node, std::string receiver) : node_(&node) {
      state_.name = std::move(receiver);
      node_->attach(&state_);
    }
    source(const source&) = delete;
    source& operator=(const source&) = delete;
    ~source() { node_->detach(&state_); }

    void open(const attempt_key& key, std::span<const std::uint32_t> owners) { node_->open(state_, key, owners); }
    source_status next(delivery& out, protocol_clock::time_point deadline) {
      return node_->next(state_, out, deadline);
    }
    bool refetch(const payload_id& id, std::vector<std::byte>& bytes) { return node_->refetch(id, bytes); }
    void close(const attempt_key& key) { node_->close(state_, key); }
    [[nodiscard]] const std::string& name() const noexcept { return state_.name; }

   private:
    relay_node* node_;
    source_state state_;
  };
};

static_assert(payload_source<relay_node::source>);

}  // namespace dcr

#include "dcr/detail/protocol/relay/relay_node.inl"
