// dcr/detail/protocol/relay/relay_node.inl: the bodies of dcr/protocol/relay/relay_node.hpp (included at its
// end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr {

DCR_NETWORK_INLINE relay_node::relay_node(relay_node_options options)
    : options_(std::move(options)), ctx_(relay_detail::make_context(options_.tls, true)) {
  relay_hello mine{relay_role::node, options_.window_bytes, options_.name};
  listener_ = std::make_unique<relay_detail::listener>(
      io_.io(), ctx_, options_.listen, options_.name, std::vector<relay_role>{relay_role::root},
      mine, options_.handshake_timeout,
      [this](std::shared_ptr<relay_link> l) { on_root(std::move(l)); },
      [this](const std::string& why) { refused(why); }, options_.accept_limits, options_.heartbeat);
  endpoint_ = listener_->endpoint();
  io_.call([this] { listener_->start(); });
}

DCR_NETWORK_INLINE relay_node::~relay_node() {
  io_.stop([this] {
    listener_->close();
    for (auto& c : conns_)
      if (c->link) c->link->close("relay node shutting down");
    conns_.clear();
  });
}

DCR_NETWORK_INLINE relay_node_stats relay_node::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

DCR_NETWORK_INLINE std::vector<std::string> relay_node::refusals() const {
  std::lock_guard lock(mutex_);
  return {refusals_.begin(), refusals_.end()};
}

DCR_NETWORK_INLINE std::size_t relay_node::roots_connected() const {
  std::lock_guard lock(mutex_);
  return live_roots_;
}

DCR_NETWORK_INLINE void relay_node::refused(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.refusals;
    refusals_.push_back(why);
    if (refusals_.size() > 64) refusals_.pop_front();
  }
  if (options_.log) options_.log(why);
}

DCR_NETWORK_INLINE void relay_node::on_root(std::shared_ptr<relay_link> link) {
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

DCR_NETWORK_INLINE void relay_node::on_lost(const std::shared_ptr<root_conn>& c, const std::string& why) {
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
  if (options_.log)
    options_.log(options_.name + " " + endpoint_.text() + ": root " + c->peer + " lost: " + why);
}

DCR_NETWORK_INLINE void relay_node::on_frame(const std::shared_ptr<root_conn>& c, relay_frame type,
                                 const relay_wire::frame_ptr& frame) {
  const std::span<const std::byte> body(frame->data() + relay_wire::header_bytes,
                                        frame->size() - relay_wire::header_bytes);
  outbox out;
  switch (type) {
    case relay_frame::attempt: {
      relay_wire::reader r(body, type);
      const auto key = r.key();
      std::vector<std::string> required(r.count(2, relay_wire::max_receivers, "receivers"));
      for (auto& name : required) name = r.str();
      r.end();
      std::lock_guard lock(mutex_);
      announce(key, std::move(required), out);
      break;
    }
    case relay_frame::chunk: {
      const auto chunk = relay_wire::parse_chunk(body);
      std::lock_guard lock(mutex_);
      receive(c, frame, chunk, out);
      break;
    }
    case relay_frame::abort: {
      relay_wire::reader r(body, type);
      const auto id = r.id();
      r.end();
      std::lock_guard lock(mutex_);
      if (auto it = held_.find(id);
          it != held_.end() && it->second.from == c && !it->second.complete) {
        c->discarding.insert(id);
        out.emplace_back(c, relay_wire::credit_frame(it->second.bytes.size));
        c->outstanding -= it->second.bytes.size;
        release_bytes(it->second);
        held_.erase(it);
      }
      break;
    }
    case relay_frame::manifest: {
      relay_wire::reader r(body, type);
      const auto key = r.key();
      const auto owner = r.u32();
      std::vector<payload_id> ids(r.count(4, relay_wire::max_manifest_payloads, "payloads"));
      for (auto& id : ids) id = {key, owner, r.u32()};
      r.end();
      std::lock_guard lock(mutex_);
      if (!current_ || key != *current_) {
        out.emplace_back(c,
                         relay_wire::nack_frame(relay_subject::manifest, {key, owner, 0},
                                                options_.name + ": not the current attempt here"));
        break;
      }
      manifests_[owner] = {std::move(ids), c, false};
      answer_manifests(out);
      break;
    }
    default:
      throw error(
          errc::corrupt_payload,
          "unexpected frame type " + std::to_string(static_cast<int>(type)) + " from a root");
  }
  wake_.notify_all();
  for (auto& [conn, f] : out)
    if (conn->link) conn->link->send(f);
}

DCR_NETWORK_INLINE void relay_node::announce(const attempt_key& key, std::vector<std::string> required,
                                 outbox& out) {
  if (current_ && !relay_wire::later_attempt(key, *current_)) return;  // the same, or older
  // A later attempt: whatever the node holds of the current one is obsolete.
  for (auto& [id, h] : held_) {
    if (h.from) {
      out.emplace_back(h.from, relay_wire::credit_frame(h.bytes.size));
      h.from->outstanding -= h.bytes.size;
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

DCR_NETWORK_INLINE void relay_node::receive(const std::shared_ptr<root_conn>& c,
                                const relay_wire::frame_ptr& frame,
                                const relay_wire::chunk_view& chunk, outbox& out) {
  if (chunk.offset == 0 && !c->discarding.contains(chunk.id) && !held_.contains(chunk.id)) {
    const bool current = current_ && chunk.id.attempt == *current_;
    const bool too_large = chunk.total > options_.max_payload_bytes;
    if (!current || too_large) {  // a late payload of a replaced attempt, or one never sized here
      out.emplace_back(c, relay_wire::credit_frame(chunk.total));
      out.emplace_back(
          c, relay_wire::nack_frame(
                 relay_subject::payload, chunk.id,
                 options_.name + ": " +
                     (too_large ? relay_wire::describe(chunk.id) + " of " +
                                      std::to_string(chunk.total) +
                                      " bytes exceeds the largest payload assembled here (" +
                                      std::to_string(options_.max_payload_bytes) + " bytes)"
                                : std::string("its attempt is not current here"))));
      if (!current) ++stats_.dropped_stale;
      if (chunk.data.size() < chunk.total) c->discarding.insert(chunk.id);
      return;
    }
    DCR_EXPECTS(c->outstanding == 0 || c->outstanding + chunk.total <= options_.window_bytes,
                errc::corrupt_payload, "root " + c->peer + " overran the window it was granted");
    auto& h = held_[chunk.id];
    if (chunk.data.size() == chunk.total) {
      h.bytes = {frame, chunk.data.data(), chunk.total};  // whole in this frame: keep it
    } else {
      auto assembled = std::make_shared<relay_wire::buffer>(chunk.total);
      h.fill = assembled->data();
      h.bytes = {std::move(assembled), h.fill, chunk.total};
    }
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
                  it->second.bytes.size == chunk.total && chunk.offset == it->second.received,
              errc::corrupt_payload,
              "chunk of " + relay_wire::describe(chunk.id) + " out of order from root " + c->peer);
  auto& h = it->second;
  if (h.fill != nullptr && !chunk.data.empty())
    std::memcpy(h.fill + chunk.offset, chunk.data.data(), chunk.data.size());
  h.received += chunk.data.size();
  if (h.received < chunk.total) return;
  h.complete = true;
  h.fill = nullptr;
  ++stats_.payloads_received;
  stats_.bytes_received += chunk.total;
  for (const auto& name : expect_) {
    const auto s = sources_.find(name);
    if (gone_.contains(name) || s == sources_.end())
      note_failure(
          h, "receiver '" + name + "' detached from " + options_.name + " " + endpoint_.text());
    else if (s->second->closed == current_)
      note_failure(h, "receiver '" + name + "' ended " + relay_wire::describe(*current_) +
                          " before taking it");
    else
      h.pending.insert(name);
  }
  arrival_.push_back(chunk.id);
  if (h.pending.empty()) release(it, out);
}

DCR_NETWORK_INLINE void relay_node::note_failure(held_payload& h, const std::string& why) {
  if (h.failure.empty()) h.failure = why;
}

DCR_NETWORK_INLINE void relay_node::release_bytes(held_payload& h) {
  if (!h.bytes) return;
  stats_.held_bytes -= h.bytes.size;
}

DCR_NETWORK_INLINE void relay_node::release(std::map<payload_id, held_payload>::iterator it, outbox& out) {
  auto& h = it->second;
  const payload_id id = it->first;
  const std::uint64_t size = h.bytes.size;
  if (h.from) {
    out.emplace_back(h.from, h.failure.empty()
                                 ? relay_wire::ack_frame(relay_subject::payload, id)
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
      cache_bytes_ -= cache_.front().second.size;
      cache_.pop_front();
    }
  } else {
    failed_[id] = h.failure;
  }
  held_.erase(it);
  answer_manifests(out);
}

DCR_NETWORK_INLINE void relay_node::answer_manifests(outbox& out) {
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
    out.emplace_back(m.from, failure.empty()
                                 ? relay_wire::ack_frame(relay_subject::manifest, mid)
                                 : relay_wire::nack_frame(relay_subject::manifest, mid, failure));
  }
}

DCR_NETWORK_INLINE void relay_node::post(outbox out) {
  if (out.empty()) return;
  asio::post(io_.io(), [out = std::move(out)] {
    for (auto& [conn, f] : out)
      if (conn->link) conn->link->send(f);
  });
}

DCR_NETWORK_INLINE std::vector<std::string> relay_node::attached_names() {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, s] : sources_) names.push_back(name);
  return names;
}

DCR_NETWORK_INLINE void relay_node::broadcast_receivers() {
  asio::post(io_.io(), [this] {
    const auto frame = relay_wire::receivers_frame(attached_names());
    for (auto& c : conns_)
      if (c->link) c->link->send(frame);
  });
}

DCR_NETWORK_INLINE void relay_node::attach(source_state* s) {
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

DCR_NETWORK_INLINE void relay_node::detach(source_state* s) {
  outbox out;
  {
    std::lock_guard lock(mutex_);
    sources_.erase(s->name);
    if (expect_.contains(s->name)) {
      gone_.insert(s->name);
      give_up(s->name,
              "receiver '" + s->name + "' detached from " + options_.name + " " + endpoint_.text(),
              out);
    }
  }
  post(std::move(out));
  broadcast_receivers();
}

DCR_NETWORK_INLINE void relay_node::give_up(const std::string& name, const std::string& why, outbox& out) {
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (it->second.complete && it->second.pending.erase(name) > 0) {
      note_failure(it->second, why);
      if (it->second.pending.empty()) release(it, out);
    }
    it = next;
  }
}

DCR_NETWORK_INLINE void relay_node::open(source_state& s, const attempt_key& key,
                             std::span<const std::uint32_t> owners) {
  std::lock_guard lock(mutex_);
  s.opened = key;
  s.owners.assign(owners.begin(), owners.end());
  std::sort(s.owners.begin(), s.owners.end());
  s.taken.clear();
  s.cursor = 0;
  s.closed.reset();
}

DCR_NETWORK_INLINE void relay_node::close(source_state& s, const attempt_key& key) {
  outbox out;
  {
    std::lock_guard lock(mutex_);
    if (s.opened != key) return;
    s.closed = key;
    if (current_ == key)
      give_up(s.name,
              "receiver '" + s.name + "' ended " + relay_wire::describe(key) + " before taking it",
              out);
  }
  post(std::move(out));
}

DCR_NETWORK_INLINE source_status relay_node::next(source_state& s, delivery& out,
                                      protocol_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (s.opened && current_ == s.opened && s.closed != s.opened) {
      DCR_EXPECTS(failure_.empty(), errc::transport_failure, failure_);
      while (s.cursor < arrival_.size()) {
        const payload_id id = arrival_[s.cursor++];
        if (s.taken.contains(id) || !std::binary_search(s.owners.begin(), s.owners.end(), id.owner))
          continue;
        payload_bytes bytes;
        if (auto h = held_.find(id); h != held_.end())
          bytes = h->second.bytes;
        else
          bytes = cached(id);
        if (!bytes) continue;  // released without this receiver (it was not expected)
        lock.unlock();
        out.id = id;
        out.bytes.assign(bytes.data, bytes.data + bytes.size);
        lock.lock();
        s.taken.insert(id);
        ++stats_.deliveries;
        outbox frames;
        if (auto h = held_.find(id);
            h != held_.end() && h->second.pending.erase(s.name) > 0 && h->second.pending.empty())
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

DCR_NETWORK_INLINE bool relay_node::complete_for(const source_state& s) const {
  for (auto owner : s.owners) {
    auto m = manifests_.find(owner);
    if (m == manifests_.end()) return false;
    for (const auto& id : m->second.ids)
      if (!s.taken.contains(id)) return false;
  }
  return true;
}

DCR_NETWORK_INLINE relay_node::payload_bytes relay_node::cached(const payload_id& id) const {
  for (const auto& [cid, bytes] : cache_)
    if (cid == id) return bytes;
  return {};
}

DCR_NETWORK_INLINE bool relay_node::refetch(const payload_id& id, std::vector<std::byte>& bytes) {
  payload_bytes held;
  {
    std::lock_guard lock(mutex_);
    if (auto h = held_.find(id); h != held_.end() && h->second.complete)
      held = h->second.bytes;
    else
      held = cached(id);
  }
  if (!held) return false;
  bytes.assign(held.data, held.data + held.size);
  return true;
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
