// dcr/protocol/relay/relay_root.hpp: a root of the relay (dcr/protocol/relay/relay.hpp), in the rollout
// cluster: owners stream payloads to it across the cluster boundary (mutual TLS), and it
// forwards each one, chunk by chunk as it arrives (cut-through), to the rollout nodes that host
// a receiver the attempt requires, over local links.
//
// Attempts. An owner announces each attempt (its key and required receivers) before its first
// payload. The root answers `ready` once every required receiver is attached to a node it is
// connected to (nodes tell it whom they host), and fixes the attempt's target nodes then; if
// that does not happen within ready_timeout it answers a nack naming the missing receivers and
// the nodes it cannot reach. A later attempt replaces the current one.
//
// Credits and memory. Each owner connection may have owner_window_bytes of chunk data at the
// root; the root returns credit as it forwards (or drops) the chunks, and closes the connection
// of an owner that sends more than its credit ("overran the window"). A payload larger than
// max_payload_bytes is refused (nacked, its chunks credited back and never forwarded). Before forwarding a
// payload's first chunk the root reserves the payload's whole size on every target node, within
// the window each node granted (a single payload larger than a node's window is admitted when
// nothing else is reserved there), in arrival order across owners, so a node's memory is
// bounded by its window and no set of half-forwarded payloads can deadlock. Payloads waiting
// for a reservation keep their chunks at the root, bounded by the owners' windows.
//
// Acknowledgements. A node acknowledges a payload once its expected receivers took it; the root
// acknowledges to the owner once every target node did, and nacks with the first reason any
// gave. A target node lost during the attempt breaks it: pending and later payloads of the
// attempt are nacked ("node ... lost"). The root reconnects to lost nodes every
// reconnect_interval; an owner lost mid-payload makes the root abort that payload at the nodes.
//
// Hostile peers. Only certificates granting the role owner connect to the listener, and only a
// node's certificate is accepted when dialing a node (dcr/protocol/relay/relay_link.hpp). Every frame
// is checked whole before anything is sized by it or forwarded: counts against the frame's
// bytes and the protocol's limits, manifests before they go to the nodes.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "dcr/config.hpp"
#include "dcr/protocol/relay/relay_link.hpp"

namespace dcr {

struct relay_root_options {
  relay_endpoint listen;               ///< where owners connect (port 0: any free port)
  std::vector<relay_endpoint> nodes;   ///< every rollout node it forwards to
  relay_tls tls;                       ///< this root's identity and the deployment's CA
  std::uint64_t owner_window_bytes = std::uint64_t{8} << 20;  ///< chunk data per owner connection
  std::chrono::milliseconds handshake_timeout{10000};
  /// The largest payload it forwards (a larger one is nacked; nodes have their own limit).
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  relay_heartbeat heartbeat;          ///< on every connection (owners' and nodes')
  relay_accept_limits accept_limits;  ///< pending handshakes of owners
  /// How long an announced attempt may wait for its receivers' nodes.
  std::chrono::milliseconds ready_timeout{10000};
  std::chrono::milliseconds reconnect_interval{100};  ///< between attempts to reach a lost node
  std::string name = "relay root";                     ///< for messages
  /// Called on the root's io thread with every refused peer and every lost connection.
  std::function<void(const std::string&)> log;
  /// Test hook, called on the io thread once a payload's first chunk went to the nodes; the
  /// simulate tool kills the process here for `--kill relay-root:STEP`.
  std::function<void(const payload_id&)> after_first_chunk;
};

/// Counters of a root since it started.
struct relay_root_stats {
  std::uint64_t payloads = 0;          ///< payloads whose first chunk was accepted
  std::uint64_t bytes_in = 0;          ///< chunk data received from owners
  std::uint64_t bytes_forwarded = 0;   ///< chunk data sent to nodes (each node counted)
  std::uint64_t buffered_bytes = 0;    ///< chunk data waiting for a reservation now
  std::uint64_t peak_buffered_bytes = 0;
  std::uint64_t refusals = 0;          ///< peers refused at connection
  std::size_t peak_pending_handshakes = 0;  ///< owners' handshakes pending at once, at most
  std::uint64_t dropped_handshakes = 0;     ///< pending handshakes dropped for newer ones
  std::size_t nodes_connected = 0;
  std::size_t owners_connected = 0;
};

class relay_root {
 public:
  /// Listens at once and starts connecting to the nodes; throws errc::transport_failure if it
  /// cannot listen, errc::invalid_argument if the TLS files cannot be used.
  explicit relay_root(relay_root_options options);
  relay_root(const relay_root&) = delete;
  relay_root& operator=(const relay_root&) = delete;
  /// Closes every connection at once (owners and nodes see the root lost).
  ~relay_root();

  [[nodiscard]] const relay_endpoint& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] relay_root_stats stats();
  /// The refusals so far (at most the last 64), each naming the peer and the reason.
  [[nodiscard]] std::vector<std::string> refusals();

 private:
  using frame_ptr = relay_wire::frame_ptr;

  struct node_state {
    node_state(asio::io_context& io, relay_endpoint a) : at(std::move(a)), retry(io) {}
    relay_endpoint at;
    std::shared_ptr<relay_link> link;
    std::set<std::string> receivers;
    std::uint64_t window = 0, outstanding = 0;
    std::string last_error = "not connected yet";
    asio::steady_timer retry;
  };
  struct owner_state;
  // One payload from its first chunk until it was forwarded whole (or dropped).
  struct inflight {
    payload_id id;
    std::uint64_t total = 0, received = 0;
    bool reserved = false, dropped = false, forwarded_any = false;
    std::vector<std::size_t> targets;
    std::deque<frame_ptr> waiting;  // chunks held until the reservation
    std::uint64_t waiting_bytes = 0;
    std::weak_ptr<owner_state> owner;
  };
  struct owner_state {
    std::shared_ptr<relay_link> link;
    std::shared_ptr<inflight> receiving;  // the payload whose chunks are arriving
    std::optional<attempt_key> ready_for;
    std::uint64_t held = 0;  // chunk data received and not credited back (<= the window)
    bool awaiting_ready = false;
    std::uint32_t owner_id = 0;
  };
  struct answer {  // a payload or manifest the owner waits to hear about
    std::weak_ptr<owner_state> owner;
    std::set<std::size_t> nodes;
    std::string failure;
  };
  struct attempt_state {
    attempt_key key;
    std::set<std::string> required;
    bool ready = false;
    std::vector<std::size_t> targets;
    std::string broken;
    std::map<payload_id, answer> payloads;
    std::map<std::uint32_t, answer> manifests;
  };

  void log(const std::string& what);
  void refused(const std::string& why);

  // ---- nodes

  void dial(std::size_t k);

  void on_node_lost(std::size_t k, const std::shared_ptr<relay_link>& link, const std::string& why);

  void on_node_frame(std::size_t k, relay_frame type, const frame_ptr& frame);

  void heard(answer& a, std::size_t k, const std::string& why);

  void answer_owner(const answer& a, relay_subject what, const payload_id& id);

  // A target node of the current attempt is gone: nothing of the attempt can be delivered
  // everywhere any more. Every payload and manifest still unanswered is nacked at once (its
  // owner need not wait for the other nodes), and so is everything of the attempt after it.
  void break_attempt(const std::string& why, std::size_t lost);

  // ---- owners

  void on_owner(std::shared_ptr<relay_link> link);

  void on_owner_lost(const std::shared_ptr<owner_state>& o, const std::string& why);

  void on_owner_frame(const std::shared_ptr<owner_state>& o, relay_frame type, const frame_ptr& frame);

  bool accepting(const owner_state& o, const attempt_key& key) const;
  std::string not_accepting(const owner_state& o, const attempt_key& key) const;

  void announced(const std::shared_ptr<owner_state>& o, const attempt_key& key, std::set<std::string> required);

  // (Re)starts the wait for the current attempt's receivers: it ends ready_timeout after the
  // last owner's announcement.
  void arm_ready_timer();

  std::string unreachable_receivers() const;

  void check_ready();

  void on_chunk(const std::shared_ptr<owner_state>& o, const frame_ptr& frame, const relay_wire::chunk_view& c);

  void forward(inflight& p, const frame_ptr& frame);

  // Returns `bytes` of chunk data to the owner's credit.
  void credit(owner_state& o, std::uint64_t bytes);

  // A payload that will not be forwarded: its held chunks' credit goes back to its owner, which
  // hears a nack.
  void drop(inflight& p, const std::string& why);

  // Reserves the waiting payloads' sizes on their target nodes, oldest first, and forwards what
  // they hold.
  void reserve();

  relay_root_options options_;
  asio::ssl::context server_ctx_, client_ctx_;
  relay_detail::io_thread io_;
  std::unique_ptr<relay_detail::listener> listener_;
  relay_endpoint endpoint_;
  std::string where_;
  // io thread only:
  bool stopping_ = false;
  std::vector<std::unique_ptr<node_state>> nodes_;
  std::vector<std::shared_ptr<owner_state>> owners_;
  std::unique_ptr<attempt_state> current_;
  std::deque<std::shared_ptr<inflight>> fifo_;
  std::unique_ptr<asio::steady_timer> ready_timer_;
  std::uint64_t ready_generation_ = 0;
  relay_root_stats stats_;
  std::deque<std::string> refusals_;
};

}  // namespace dcr

#include "dcr/detail/protocol/relay/relay_root.inl"
