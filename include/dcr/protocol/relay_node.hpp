// dcr/protocol/relay_node.hpp: the rollout-node end of the relay (dcr/protocol/relay.hpp): it
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
// admitted when nothing else of that root is held. Delivered payloads are kept for refetch up to
// refetch_bytes (oldest dropped first; a refetch of a dropped one answers false).
//
// Failures. A root connection lost while a payload of the current attempt was still arriving
// from it breaks the attempt here: the sources of its receivers throw errc::transport_failure
// naming the root from next(). Every wait in next() ends at its deadline.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/relay_link.hpp"

namespace dcr {

struct relay_node_options {
  relay_endpoint listen;  ///< where roots connect (port 0: any free port, see endpoint())
  relay_tls tls;          ///< this node's identity and the deployment's CA
  /// Payload bytes one root connection may have held here at a time (see the file comment).
  std::uint64_t window_bytes = std::uint64_t{256} << 20;
  /// Delivered payloads kept for refetch (bytes).
  std::uint64_t refetch_bytes = std::uint64_t{64} << 20;
  std::chrono::milliseconds handshake_timeout{10000};
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
  explicit relay_node(relay_node_options options)
      : options_(std::move(options)), ctx_(relay_detail::make_context(options_.tls, true)) {
    relay_hello mine{relay_role::node, options_.window_bytes, options_.name};
    listener_ = std::make_unique<relay_detail::listener>(
        io_.io(), ctx_, options_.listen, options_.name, std::vector<relay_role>{relay_role::root}, mine,
        options_.handshake_timeout, [this](std::shared_ptr<relay_link> l) { on_root(std::move(l)); },
        [this](const std::string& why) { refused(why); });
    endpoint_ = listener_->endpoint();
    io_.call([this] { listener_->start(); });
  }
  relay_node(const relay_node&) = delete;
  relay_node& operator=(const relay_node&) = delete;
  /// Closes every connection (roots see the node lost). Sources must be destroyed first.
  ~relay_node() {
    io_.stop([this] {
      listener_->close();
      for (auto& c : conns_)
        if (c->link) c->link->close("relay node shutting down");
      conns_.clear();
    });
  }

  /// Where roots connect.
  [[nodiscard]] const relay_endpoint& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] relay_node_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// The refusals so far (at most the last 64), each naming the peer and the reason.
  [[nodiscard]] std::vector<std::string> refusals() const {
    std::lock_guard lock(mutex_);
    return {refusals_.begin(), refusals_.end()};
  }
  /// Root connections established now.
  [[nodiscard]] std::size_t roots_connected() const {
    std::lock_guard lock(mutex_);
    return live_roots_;
  }

 private:
  struct root_conn {
    std::shared_ptr<relay_link> link;  // io thread only
    std::string peer;
    std::uint64_t outstanding = 0;     // bytes reserved by the root and not credited back
    std::set<payload_id> discarding;   // payloads whose remaining chunks are ignored
  };
  struct held_payload {
    std::shared_ptr<relay_wire::buffer> bytes;
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

  void refused(const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.refusals;
      refusals_.push_back(why);
      if (refusals_.size() > 64) refusals_.pop_front();
    }
    if (options_.log) options_.log(why);
  }

  void on_root(std::shared_ptr<relay_link> link) {
    auto c = std::make_shared<root_conn>();
    c->link = link;
    c->peer = link->peer();
    conns_.push_back(c);
    {
      std::lock_guard lock(mutex_);
      ++live_roots_;
    }
    link->start([this, c](relay_frame t, const relay_wire::frame_ptr& f) { on_frame(c, t, f); },
                [this, c](const std::string& why) { on_lost(c, why); });
    link->send(relay_wire::receivers_frame(attached_names()));
  }

  void on_lost(const std::shared_ptr<root_conn>& c, const std::string& why) {
    std::erase(conns_, c);
    c->link.reset();
    {
      std::lock_guard lock(mutex_);
      --live_roots_;
      // Payloads still arriving from it will never be whole: the attempt cannot complete here.
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->second.from != c) {
          ++it;
          continue;
        }
        if (!it->second.complete) {
          if (failure_.empty())
            failure_ = options_.name + " " + endpoint_.text() + ": root " + c->peer + " lost while " +
                       relay_wire::describe(it->first) + " was arriving (" + why + ")";
          release_bytes(it->second);
          it = held_.erase(it);
        } else {
          it->second.from.reset();  // still delivered; no one to acknowledge to
          ++it;
        }
      }
      for (auto& [owner, m] : manifests_)
        if (m.from == c) m.from.reset();
    }
    wake_.notify_all();
    if (options_.log) options_.log(options_.name + " " + endpoint_.text() + ": root " + c->peer + " lost: " + why);
  }

  void on_frame(const std::shared_ptr<root_conn>& c, relay_frame type, const relay_wire::frame_ptr& frame) {
    const std::span<const std::byte> body(frame->data() + relay_wire::header_bytes,
                                          frame->size() - relay_wire::header_bytes);
    outbox out;
    switch (type) {
      case relay_frame::attempt: {
        relay_wire::reader r(body, type);
        const auto key = r.key();
        std::vector<std::string> required(r.u32());
        for (auto& name : required) name = r.str();
        r.end();
        std::lock_guard lock(mutex_);
        announce(key, std::move(required), out);
        break;
      }
      case relay_frame::chunk: {
        const auto chunk = relay_wire::parse_chunk(body);
        std::lock_guard lock(mutex_);
        receive(c, chunk, out);
        break;
      }
      case relay_frame::abort: {
        relay_wire::reader r(body, type);
        const auto id = r.id();
        r.end();
        std::lock_guard lock(mutex_);
        if (auto it = held_.find(id); it != held_.end() && it->second.from == c && !it->second.complete) {
          c->discarding.insert(id);
          out.emplace_back(c, relay_wire::credit_frame(it->second.bytes->size()));
          c->outstanding -= it->second.bytes->size();
          release_bytes(it->second);
          held_.erase(it);
        }
        break;
      }
      case relay_frame::manifest: {
        relay_wire::reader r(body, type);
        const auto key = r.key();
        const auto owner = r.u32();
        std::vector<payload_id> ids(r.u32());
        for (auto& id : ids) id = {key, owner, r.u32()};
        r.end();
        std::lock_guard lock(mutex_);
        if (!current_ || key != *current_) {
          out.emplace_back(c, relay_wire::nack_frame(relay_subject::manifest, {key, owner, 0},
                                                     options_.name + ": not the current attempt here"));
          break;
        }
        manifests_[owner] = {std::move(ids), c, false};
        answer_manifests(out);
        break;
      }
      default:
        throw error(errc::corrupt_payload, "unexpected frame type " + std::to_string(static_cast<int>(type)) +
                                               " from a root");
    }
    wake_.notify_all();
    for (auto& [conn, f] : out)
      if (conn->link) conn->link->send(f);
  }

  // ---- state changes (mutex held)

  void announce(const attempt_key& key, std::vector<std::string> required, outbox& out) {
    if (current_ && !relay_wire::later_attempt(key, *current_)) return;  // the same, or older
    // A later attempt: whatever the node holds of the current one is obsolete.
    for (auto& [id, h] : held_) {
      if (h.from) {
        out.emplace_back(h.from, relay_wire::credit_frame(h.bytes->size()));
        h.from->outstanding -= h.bytes->size();
        if (!h.complete) h.from->discarding.insert(id);
      }
      if (h.complete && !h.pending.empty()) ++stats_.dropped_stale;
      release_bytes(h);
    }
    held_.clear();
    manifests_.clear();
    arrival_.clear();
    delivered_ok_.clear();
    failed_.clear();
    cache_.clear();
    cache_bytes_ = 0;
    failure_.clear();
    current_ = key;
    required_ = std::set<std::string>(required.begin(), required.end());
    expect_.clear();
    for (const auto& [name, s] : sources_)
      if (required_.contains(name)) expect_.insert(name);
    gone_.clear();
  }

  void receive(const std::shared_ptr<root_conn>& c, const relay_wire::chunk_view& chunk, outbox& out) {
    if (chunk.offset == 0 && !c->discarding.contains(chunk.id) && !held_.contains(chunk.id)) {
      const bool current = current_ && chunk.id.attempt == *current_;
      if (!current) {  // a late payload of a replaced attempt: never delivered
        out.emplace_back(c, relay_wire::credit_frame(chunk.total));
        out.emplace_back(c, relay_wire::nack_frame(relay_subject::payload, chunk.id,
                                                   options_.name + ": its attempt is not current here"));
        ++stats_.dropped_stale;
        if (chunk.data.size() < chunk.total) c->discarding.insert(chunk.id);
        return;
      }
      DCR_EXPECTS(c->outstanding == 0 || c->outstanding + chunk.total <= options_.window_bytes,
                  errc::corrupt_payload, "root " + c->peer + " overran the window it was granted");
      auto& h = held_[chunk.id];
      h.bytes = std::make_shared<relay_wire::buffer>(chunk.total);
      h.from = c;
      c->outstanding += chunk.total;
      stats_.held_bytes += chunk.total;
      stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, stats_.held_bytes);
    }
    if (c->discarding.contains(chunk.id)) {
      if (chunk.offset + chunk.data.size() == chunk.total) c->discarding.erase(chunk.id);
      return;
    }
    auto it = held_.find(chunk.id);
    DCR_EXPECTS(it != held_.end() && it->second.from == c && !it->second.complete &&
                    it->second.bytes->size() == chunk.total && chunk.offset == it->second.received,
                errc::corrupt_payload, "chunk of " + relay_wire::describe(chunk.id) + " out of order from root " + c->peer);
    auto& h = it->second;
    std::copy(chunk.data.begin(), chunk.data.end(), h.bytes->begin() + static_cast<std::ptrdiff_t>(chunk.offset));
    h.received += chunk.data.size();
    if (h.received < chunk.total) return;
    h.complete = true;
    ++stats_.payloads_received;
    stats_.bytes_received += chunk.total;
    for (const auto& name : expect_) {
      const auto s = sources_.find(name);
      if (gone_.contains(name) || s == sources_.end())
        note_failure(h, "receiver '" + name + "' detached from " + options_.name + " " + endpoint_.text());
      else if (s->second->closed == current_)
        note_failure(h, "receiver '" + name + "' ended " + relay_wire::describe(*current_) + " before taking it");
      else
        h.pending.insert(name);
    }
    arrival_.push_back(chunk.id);
    if (h.pending.empty()) release(it, out);
  }

  static void note_failure(held_payload& h, const std::string& why) {
    if (h.failure.empty()) h.failure = why;
  }

  void release_bytes(held_payload& h) {
    if (!h.bytes) return;
    stats_.held_bytes -= h.bytes->size();
  }

  // Every expected receiver has taken (or will not take) the payload: answer the root, return
  // its credit, keep it for refetch.
  void release(std::map<payload_id, held_payload>::iterator it, outbox& out) {
    auto& h = it->second;
    const payload_id id = it->first;
    const std::uint64_t size = h.bytes->size();
    if (h.from) {
      out.emplace_back(h.from, h.failure.empty() ? relay_wire::ack_frame(relay_subject::payload, id)
                                                 : relay_wire::nack_frame(relay_subject::payload, id, h.failure));
      out.emplace_back(h.from, relay_wire::credit_frame(size));
      h.from->outstanding -= size;
    }
    stats_.held_bytes -= size;
    if (h.failure.empty()) {
      delivered_ok_.insert(id);
      cache_bytes_ += size;
      cache_.emplace_back(id, std::move(h.bytes));
      while (cache_bytes_ > options_.refetch_bytes && !cache_.empty()) {
        cache_bytes_ -= cache_.front().second->size();
        cache_.pop_front();
      }
    } else {
      failed_[id] = h.failure;
    }
    held_.erase(it);
    answer_manifests(out);
  }

  void answer_manifests(outbox& out) {
    for (auto& [owner, m] : manifests_) {
      if (m.answered) continue;
      std::string failure;
      bool all = true;
      for (const auto& id : m.ids) {
        if (auto f = failed_.find(id); f != failed_.end()) {
          failure = relay_wire::describe(id) + ": " + f->second;
          break;
        }
        all = all && delivered_ok_.contains(id);
      }
      if (failure.empty() && !all) continue;
      m.answered = true;
      if (!m.from) continue;
      const payload_id mid{*current_, owner, 0};
      out.emplace_back(m.from, failure.empty() ? relay_wire::ack_frame(relay_subject::manifest, mid)
                                               : relay_wire::nack_frame(relay_subject::manifest, mid, failure));
    }
  }

  // Posts frames to the io thread (from a receiver's thread).
  void post(outbox out) {
    if (out.empty()) return;
    asio::post(io_.io(), [out = std::move(out)] {
      for (auto& [conn, f] : out)
        if (conn->link) conn->link->send(f);
    });
  }

  std::vector<std::string> attached_names() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> names;
    for (const auto& [name, s] : sources_) names.push_back(name);
    return names;
  }
  void broadcast_receivers() {
    asio::post(io_.io(), [this] {
      const auto frame = relay_wire::receivers_frame(attached_names());
      for (auto& c : conns_)
        if (c->link) c->link->send(frame);
    });
  }

  // ---- the receiver side (called by sources)

  void attach(source_state* s) {
    {
      std::lock_guard lock(mutex_);
      DCR_EXPECTS(!sources_.contains(s->name), errc::invalid_argument,
                  options_.name + ": a receiver named '" + s->name + "' is attached already");
      sources_[s->name] = s;
      gone_.erase(s->name);
      if (required_.contains(s->name)) expect_.insert(s->name);
    }
    broadcast_receivers();
  }

  void detach(source_state* s) {
    outbox out;
    {
      std::lock_guard lock(mutex_);
      sources_.erase(s->name);
      if (expect_.contains(s->name)) {
        gone_.insert(s->name);
        give_up(s->name, "receiver '" + s->name + "' detached from " + options_.name + " " + endpoint_.text(), out);
      }
    }
    post(std::move(out));
    broadcast_receivers();
  }

  // `name` will take nothing more of the current attempt.
  void give_up(const std::string& name, const std::string& why, outbox& out) {
    for (auto it = held_.begin(); it != held_.end();) {
      auto next = std::next(it);
      if (it->second.complete && it->second.pending.erase(name) > 0) {
        note_failure(it->second, why);
        if (it->second.pending.empty()) release(it, out);
      }
      it = next;
    }
  }

  void open(source_state& s, const attempt_key& key, std::span<const std::uint32_t> owners) {
    std::lock_guard lock(mutex_);
    s.opened = key;
    s.owners.assign(owners.begin(), owners.end());
    std::sort(s.owners.begin(), s.owners.end());
    s.taken.clear();
    s.cursor = 0;
    s.closed.reset();
  }

  void close(source_state& s, const attempt_key& key) {
    outbox out;
    {
      std::lock_guard lock(mutex_);
      if (s.opened != key) return;
      s.closed = key;
      if (current_ == key)
        give_up(s.name, "receiver '" + s.name + "' ended " + relay_wire::describe(key) + " before taking it", out);
    }
    post(std::move(out));
  }

  source_status next(source_state& s, delivery& out, protocol_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (s.opened && current_ == s.opened && s.closed != s.opened) {
        DCR_EXPECTS(failure_.empty(), errc::transport_failure, failure_);
        while (s.cursor < arrival_.size()) {
          const payload_id id = arrival_[s.cursor++];
          if (s.taken.contains(id) || !std::binary_search(s.owners.begin(), s.owners.end(), id.owner)) continue;
          std::shared_ptr<relay_wire::buffer> bytes;
          if (auto h = held_.find(id); h != held_.end()) bytes = h->second.bytes;
          else bytes = cached(id);
          if (!bytes) continue;  // released without this receiver (it was not expected)
          lock.unlock();
          out.id = id;
          out.bytes.assign(bytes->begin(), bytes->end());
          lock.lock();
          s.taken.insert(id);
          ++stats_.deliveries;
          outbox frames;
          if (auto h = held_.find(id); h != held_.end() && h->second.pending.erase(s.name) > 0 &&
                                       h->second.pending.empty())
            release(h, frames);
          lock.unlock();
          post(std::move(frames));
          return source_status::delivered;
        }
        if (complete_for(s)) return source_status::complete;
      }
      if (wake_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (s.opened && current_ == s.opened && s.cursor < arrival_.size()) continue;
        return source_status::timed_out;
      }
    }
  }

  bool complete_for(const source_state& s) const {
    for (auto owner : s.owners) {
      auto m = manifests_.find(owner);
      if (m == manifests_.end()) return false;
      for (const auto& id : m->second.ids)
        if (!s.taken.contains(id)) return false;
    }
    return true;
  }

  std::shared_ptr<relay_wire::buffer> cached(const payload_id& id) const {
    for (const auto& [cid, bytes] : cache_)
      if (cid == id) return bytes;
    return nullptr;
  }

  bool refetch(const payload_id& id, std::vector<std::byte>& bytes) {
    std::shared_ptr<relay_wire::buffer> held;
    {
      std::lock_guard lock(mutex_);
      if (auto h = held_.find(id); h != held_.end() && h->second.complete) held = h->second.bytes;
      else held = cached(id);
    }
    if (!held) return false;
    bytes.assign(held->begin(), held->end());
    return true;
  }

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
  std::deque<std::pair<payload_id, std::shared_ptr<relay_wire::buffer>>> cache_;
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
