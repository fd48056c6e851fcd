// dcr/detail/protocol/relay/relay_root.inl: the bodies of dcr/protocol/relay/relay_root.hpp (included at its
// end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr {

DCR_NETWORK_INLINE relay_root::relay_root(relay_root_options options)
    : options_(std::move(options)),
      server_ctx_(relay_detail::make_context(options_.tls, true)),
      client_ctx_(relay_detail::make_context(options_.tls, false)) {
  relay_hello mine{relay_role::root, options_.owner_window_bytes, options_.name};
  listener_ = std::make_unique<relay_detail::listener>(
      io_.io(), server_ctx_, options_.listen, options_.name,
      std::vector<relay_role>{relay_role::owner}, mine, options_.handshake_timeout,
      [this](std::shared_ptr<relay_link> l) { on_owner(std::move(l)); },
      [this](const std::string& why) { refused(why); }, options_.accept_limits, options_.heartbeat);
  endpoint_ = listener_->endpoint();
  where_ = options_.name + " " + endpoint_.text();
  io_.call([this] {
    for (const auto& at : options_.nodes) {
      nodes_.push_back(std::make_unique<node_state>(io_.io(), at));
      dial(nodes_.size() - 1);
    }
    listener_->start();
  });
}

DCR_NETWORK_INLINE relay_root::~relay_root() {
  io_.stop([this] {
    stopping_ = true;
    listener_->close();
    if (ready_timer_) ready_timer_->cancel();
    for (auto& n : nodes_) {
      n->retry.cancel();
      if (n->link) n->link->close("relay root shutting down");
    }
    for (auto& o : owners_)
      if (o->link) o->link->close("relay root shutting down");
    owners_.clear();
    fifo_.clear();
    current_.reset();
  });
}

DCR_NETWORK_INLINE relay_root_stats relay_root::stats() {
  return io_.call([this] {
    auto s = stats_;
    s.nodes_connected = static_cast<std::size_t>(
        std::count_if(nodes_.begin(), nodes_.end(), [](auto& n) { return n->link != nullptr; }));
    s.owners_connected = owners_.size();
    s.peak_pending_handshakes = listener_->peak_pending();
    s.dropped_handshakes = listener_->dropped();
    return s;
  });
}

DCR_NETWORK_INLINE std::vector<std::string> relay_root::refusals() {
  return io_.call([this] { return std::vector<std::string>(refusals_.begin(), refusals_.end()); });
}

DCR_NETWORK_INLINE void relay_root::log(const std::string& what) {
  if (options_.log) options_.log(what);
}

DCR_NETWORK_INLINE void relay_root::refused(const std::string& why) {
  ++stats_.refusals;
  refusals_.push_back(why);
  if (refusals_.size() > 64) refusals_.pop_front();
  log(why);
}

DCR_NETWORK_INLINE void relay_root::dial(std::size_t k) {
  if (stopping_) return;
  auto& n = *nodes_[k];
  relay_hello mine{relay_role::root, 0, where_};
  auto e = std::make_shared<relay_detail::establishing>(
      io_.io(), client_ctx_, mine, options_.handshake_timeout,
      [this, k](std::shared_ptr<relay_link> link, const std::string& err, bool) {
        if (stopping_) return;
        auto& node = *nodes_[k];
        if (!link) {
          if (err != node.last_error) log(where_ + ": " + err);
          node.last_error = err;
          node.retry.expires_after(options_.reconnect_interval);
          node.retry.async_wait([this, k](const asio::error_code& ec) {
            if (!ec) dial(k);
          });
          return;
        }
        node.link = link;
        node.window = link->hello().window;
        node.outstanding = 0;
        node.receivers.clear();
        node.last_error.clear();
        link->start([this, k](relay_frame t, const frame_ptr& f) { on_node_frame(k, t, f); },
                    [this, k, link](const std::string& why) { on_node_lost(k, link, why); });
      },
      options_.heartbeat);
  e->dial(n.at, "node", relay_role::node);
}

DCR_NETWORK_INLINE void relay_root::on_node_lost(std::size_t k, const std::shared_ptr<relay_link>& link,
                                     const std::string& why) {
  auto& n = *nodes_[k];
  if (n.link != link) return;
  n.link.reset();
  n.receivers.clear();
  n.outstanding = 0;
  n.last_error = "lost: " + why;
  log(where_ + ": node " + n.at.text() + " lost: " + why);
  if (current_ &&
      std::find(current_->targets.begin(), current_->targets.end(), k) != current_->targets.end())
    break_attempt("node " + n.at.text() + " was lost during " +
                      relay_wire::describe(current_->key) + " (" + why + ")",
                  k);
  if (!stopping_) {
    n.retry.expires_after(options_.reconnect_interval);
    n.retry.async_wait([this, k](const asio::error_code& ec) {
      if (!ec) dial(k);
    });
  }
}

DCR_NETWORK_INLINE void relay_root::on_node_frame(std::size_t k, relay_frame type, const frame_ptr& frame) {
  auto& n = *nodes_[k];
  const std::span<const std::byte> body(frame->data() + relay_wire::header_bytes,
                                        frame->size() - relay_wire::header_bytes);
  relay_wire::reader r(body, type);
  switch (type) {
    case relay_frame::receivers: {
      std::set<std::string> names;
      for (auto count = r.count(2, relay_wire::max_receivers, "receivers"); count > 0; --count)
        names.insert(r.str());
      r.end();
      n.receivers = std::move(names);
      check_ready();
      break;
    }
    case relay_frame::credit: {
      const auto bytes = r.u64();
      r.end();
      n.outstanding -= std::min(bytes, n.outstanding);
      reserve();
      break;
    }
    case relay_frame::ack:
    case relay_frame::nack: {
      const auto what = static_cast<relay_subject>(r.u8());
      const auto id = r.id();
      std::string why = type == relay_frame::nack ? r.str() : std::string();
      r.end();
      if (!current_ || id.attempt != current_->key) break;  // a replaced attempt
      if (what == relay_subject::payload) {
        if (auto it = current_->payloads.find(id); it != current_->payloads.end()) {
          heard(it->second, k, why);
          if (it->second.nodes.empty()) {
            answer_owner(it->second, relay_subject::payload, id);
            current_->payloads.erase(it);
          }
        }
      } else if (what == relay_subject::manifest) {
        if (auto it = current_->manifests.find(id.owner); it != current_->manifests.end()) {
          heard(it->second, k, why);
          if (it->second.nodes.empty()) {
            answer_owner(it->second, relay_subject::manifest, id);
            current_->manifests.erase(it);
          }
        }
      }
      break;
    }
    default:
      throw error(
          errc::corrupt_payload,
          "unexpected frame type " + std::to_string(static_cast<int>(type)) + " from a node");
  }
}

DCR_NETWORK_INLINE void relay_root::heard(answer& a, std::size_t k, const std::string& why) {
  if (a.nodes.erase(k) == 0) return;
  if (!why.empty() && a.failure.empty()) a.failure = "node " + nodes_[k]->at.text() + ": " + why;
}

DCR_NETWORK_INLINE void relay_root::answer_owner(const answer& a, relay_subject what, const payload_id& id) {
  auto o = a.owner.lock();
  if (!o || !o->link) return;
  o->link->send(a.failure.empty() ? relay_wire::ack_frame(what, id)
                                  : relay_wire::nack_frame(what, id, where_ + ": " + a.failure));
}

DCR_NETWORK_INLINE void relay_root::break_attempt(const std::string& why, std::size_t lost) {
  auto& a = *current_;
  if (a.broken.empty()) a.broken = why;
  for (auto& [id, ans] : a.payloads) {
    heard(ans, lost, why);
    if (ans.failure.empty()) ans.failure = why;
    answer_owner(ans, relay_subject::payload, id);
  }
  a.payloads.clear();
  for (auto& [owner, ans] : a.manifests) {
    heard(ans, lost, why);
    if (ans.failure.empty()) ans.failure = why;
    answer_owner(ans, relay_subject::manifest, {a.key, owner, 0});
  }
  a.manifests.clear();
  // Payloads waiting for a reservation can no longer get one on the lost node.
  for (auto& p : fifo_) drop(*p, why);
  fifo_.clear();
}

DCR_NETWORK_INLINE void relay_root::on_owner(std::shared_ptr<relay_link> link) {
  auto o = std::make_shared<owner_state>();
  o->link = link;
  owners_.push_back(o);
  std::weak_ptr<owner_state> w = o;
  link->start(
      [this, w](relay_frame t, const frame_ptr& f) {
        if (auto o2 = w.lock()) on_owner_frame(o2, t, f);
      },
      [this, w](const std::string& why) {
        if (auto o2 = w.lock()) on_owner_lost(o2, why);
      });
}

DCR_NETWORK_INLINE void relay_root::on_owner_lost(const std::shared_ptr<owner_state>& o,
                                      const std::string& why) {
  std::erase(owners_, o);
  o->link.reset();
  log(where_ + ": owner lost: " + why);
  // Its payload in flight will never be whole: the nodes drop what they hold of it.
  if (auto p = o->receiving; p && p->received < p->total) {
    if (p->reserved) {
      const auto f = relay_wire::writer(relay_frame::abort).id(p->id).done();
      for (auto k : p->targets)
        if (nodes_[k]->link) nodes_[k]->link->send(f);
    }
    p->dropped = true;
    stats_.buffered_bytes -= p->waiting_bytes;
    p->waiting.clear();
    p->waiting_bytes = 0;
  }
  std::erase_if(fifo_, [&](const std::shared_ptr<inflight>& p) {
    if (p->owner.lock() != o) return false;
    stats_.buffered_bytes -= p->waiting_bytes;
    return true;
  });
  o->receiving.reset();
  reserve();
}

DCR_NETWORK_INLINE void relay_root::on_owner_frame(const std::shared_ptr<owner_state>& o, relay_frame type,
                                       const frame_ptr& frame) {
  const std::span<const std::byte> body(frame->data() + relay_wire::header_bytes,
                                        frame->size() - relay_wire::header_bytes);
  switch (type) {
    case relay_frame::attempt: {
      relay_wire::reader r(body, type);
      const auto key = r.key();
      std::set<std::string> required;
      for (auto n = r.count(2, relay_wire::max_receivers, "receivers"); n > 0; --n)
        required.insert(r.str());
      r.end();
      announced(o, key, std::move(required));
      break;
    }
    case relay_frame::chunk:
      on_chunk(o, frame, relay_wire::parse_chunk(body));
      break;
    case relay_frame::manifest: {
      // Checked whole before it goes anywhere: the nodes must never see a malformed manifest.
      relay_wire::reader r(body, type);
      const auto key = r.key();
      const auto owner = r.u32();
      for (auto n = r.count(4, relay_wire::max_manifest_payloads, "payloads"); n > 0; --n)
        (void)r.u32();
      r.end();
      const payload_id mid{key, owner, 0};
      if (!accepting(*o, key)) {
        o->link->send(relay_wire::nack_frame(relay_subject::manifest, mid,
                                             where_ + ": " + not_accepting(*o, key)));
        break;
      }
      auto& a = *current_;
      answer& ans = a.manifests[owner];
      ans.owner = o;
      ans.failure.clear();
      ans.nodes.clear();
      for (auto k : a.targets)
        if (nodes_[k]->link) {
          ans.nodes.insert(k);
          nodes_[k]->link->send(frame);
        }
      break;
    }
    default:
      throw error(
          errc::corrupt_payload,
          "unexpected frame type " + std::to_string(static_cast<int>(type)) + " from an owner");
  }
}

DCR_NETWORK_INLINE bool relay_root::accepting(const owner_state& o, const attempt_key& key) const {
  return current_ && current_->key == key && current_->ready && o.ready_for == key &&
         current_->broken.empty();
}

DCR_NETWORK_INLINE std::string relay_root::not_accepting(const owner_state& o, const attempt_key& key) const {
  if (!current_ || current_->key != key)
    return relay_wire::describe(key) + " is not the current attempt here";
  if (!current_->broken.empty()) return current_->broken;
  (void)o;
  return relay_wire::describe(key) + " was not announced as ready to this owner";
}

DCR_NETWORK_INLINE void relay_root::announced(const std::shared_ptr<owner_state>& o, const attempt_key& key,
                                  std::set<std::string> required) {
  const payload_id aid{key, 0, 0};
  if (current_ && key != current_->key && !relay_wire::later_attempt(key, current_->key)) {
    o->link->send(relay_wire::nack_frame(relay_subject::attempt, aid,
                                         where_ + ": " + relay_wire::describe(key) +
                                             " was replaced by " +
                                             relay_wire::describe(current_->key)));
    return;
  }
  if (!current_ || relay_wire::later_attempt(key, current_->key)) {
    // A new attempt: the old one is over (fenced or committed); drop what waits of it.
    for (auto& p : fifo_) drop(*p, relay_wire::describe(key) + " replaced its attempt");
    fifo_.clear();
    current_ = std::make_unique<attempt_state>();
    current_->key = key;
    current_->required = std::move(required);
    for (auto& other : owners_) other->awaiting_ready = false;
  }
  o->awaiting_ready = true;
  o->ready_for.reset();
  check_ready();
  if (o->awaiting_ready) arm_ready_timer();
}

DCR_NETWORK_INLINE void relay_root::arm_ready_timer() {
  if (!ready_timer_) ready_timer_ = std::make_unique<asio::steady_timer>(io_.io());
  const auto generation = ++ready_generation_;
  ready_timer_->expires_after(options_.ready_timeout);
  ready_timer_->async_wait([this, generation](const asio::error_code& ec) {
    if (ec || generation != ready_generation_ || stopping_ || !current_ || current_->ready) return;
    const auto why = where_ + ": " + unreachable_receivers();
    const payload_id aid{current_->key, 0, 0};
    for (auto& o : owners_)
      if (o->awaiting_ready) {
        o->awaiting_ready = false;
        if (o->link) o->link->send(relay_wire::nack_frame(relay_subject::attempt, aid, why));
      }
  });
}

DCR_NETWORK_INLINE std::string relay_root::unreachable_receivers() const {
  std::string missing, nodes;
  for (const auto& name : current_->required)
    if (!std::any_of(nodes_.begin(), nodes_.end(),
                     [&](auto& n) { return n->link && n->receivers.contains(name); }))
      missing += (missing.empty() ? "'" : ", '") + name + "'";
  for (const auto& n : nodes_) {
    nodes += (nodes.empty() ? "" : "; ") + n->at.text() + " ";
    if (n->link) {
      std::string rs;
      for (const auto& r : n->receivers) rs += (rs.empty() ? "" : " ") + r;
      nodes += "connected, hosting [" + rs + "]";
    } else {
      nodes += n->last_error;
    }
  }
  return "receiver(s) " + missing + " of " + relay_wire::describe(current_->key) +
         " not attached to any connected node after " +
         std::to_string(options_.ready_timeout.count()) + " ms (nodes: " + nodes + ")";
}

DCR_NETWORK_INLINE void relay_root::check_ready() {
  if (!current_) return;
  auto& a = *current_;
  if (!a.ready) {
    for (const auto& name : a.required)
      if (!std::any_of(nodes_.begin(), nodes_.end(),
                       [&](auto& n) { return n->link && n->receivers.contains(name); }))
        return;
    a.ready = true;
    std::vector<std::string> names(a.required.begin(), a.required.end());
    const auto announce = relay_wire::attempt_frame(a.key, names);
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      const auto& n = *nodes_[k];
      if (!n.link) continue;
      if (std::none_of(a.required.begin(), a.required.end(),
                       [&](auto& name) { return n.receivers.contains(name); }))
        continue;
      a.targets.push_back(k);
      n.link->send(announce);
    }
    ++ready_generation_;
  }
  for (auto& o : owners_)
    if (o->awaiting_ready) {
      o->awaiting_ready = false;
      o->ready_for = a.key;
      o->link->send(relay_wire::writer(relay_frame::ready).key(a.key).done());
    }
}

DCR_NETWORK_INLINE void relay_root::on_chunk(const std::shared_ptr<owner_state>& o, const frame_ptr& frame,
                                 const relay_wire::chunk_view& c) {
  const std::uint64_t bytes = c.data.size();
  // The window it advertised in its hello is enforced, not just advertised.
  o->held += bytes;
  DCR_EXPECTS(o->held <= options_.owner_window_bytes, errc::corrupt_payload,
              "owner " + o->link->peer() + " overran the window of " +
                  std::to_string(options_.owner_window_bytes) + " bytes it was granted (" +
                  std::to_string(o->held) + " bytes of chunk data not credited back)");
  stats_.bytes_in += bytes;
  if (c.offset == 0) {
    DCR_EXPECTS(!o->receiving || o->receiving->received == o->receiving->total,
                errc::corrupt_payload, "a new payload began before the previous one was whole");
    auto p = std::make_shared<inflight>();
    p->id = c.id;
    p->total = c.total;
    p->owner = o;
    o->receiving = p;
    const auto key = c.id.attempt;
    if (!accepting(*o, key)) {
      p->dropped = true;
      o->link->send(relay_wire::nack_frame(relay_subject::payload, c.id,
                                           where_ + ": " + not_accepting(*o, key)));
    } else if (c.total > options_.max_payload_bytes) {
      p->dropped = true;
      o->link->send(relay_wire::nack_frame(
          relay_subject::payload, c.id,
          where_ + ": " + relay_wire::describe(c.id) + " of " + std::to_string(c.total) +
              " bytes exceeds the largest payload forwarded here (" +
              std::to_string(options_.max_payload_bytes) + " bytes)"));
    } else {
      ++stats_.payloads;
      auto& ans = current_->payloads[c.id];
      ans.owner = o;
      ans.failure.clear();
      ans.nodes.clear();
      for (auto k : current_->targets)
        if (nodes_[k]->link) {
          p->targets.push_back(k);
          ans.nodes.insert(k);
        }
      if (ans.nodes.empty()) {  // cannot happen while the attempt is unbroken; never hang on it
        ans.failure = "no target node is connected";
        answer_owner(ans, relay_subject::payload, c.id);
        current_->payloads.erase(c.id);
        p->dropped = true;
      } else {
        fifo_.push_back(p);
      }
    }
  }
  auto p = o->receiving;
  DCR_EXPECTS(p && p->id == c.id && c.offset == p->received && c.total == p->total,
              errc::corrupt_payload, "chunk of " + relay_wire::describe(c.id) + " out of order");
  p->received += bytes;
  if (p->dropped) {
    credit(*o, bytes);
  } else if (p->reserved) {
    forward(*p, frame);
    credit(*o, bytes);
  } else {
    p->waiting.push_back(frame);
    p->waiting_bytes += bytes;
    stats_.buffered_bytes += bytes;
    stats_.peak_buffered_bytes = std::max(stats_.peak_buffered_bytes, stats_.buffered_bytes);
    reserve();
  }
}

DCR_NETWORK_INLINE void relay_root::forward(inflight& p, const frame_ptr& frame) {
  const auto bytes = frame->size() - relay_wire::chunk_overhead;
  for (auto k : p.targets)
    if (nodes_[k]->link) {
      nodes_[k]->link->send(frame);
      stats_.bytes_forwarded += bytes;
    }
  if (!p.forwarded_any) {
    p.forwarded_any = true;
    if (options_.after_first_chunk) options_.after_first_chunk(p.id);
  }
}

DCR_NETWORK_INLINE void relay_root::credit(owner_state& o, std::uint64_t bytes) {
  if (bytes == 0) return;
  o.held -= std::min(bytes, o.held);
  if (o.link) o.link->send(relay_wire::credit_frame(bytes));
}

DCR_NETWORK_INLINE void relay_root::drop(inflight& p, const std::string& why) {
  if (p.dropped) return;
  p.dropped = true;
  auto o = p.owner.lock();
  if (o && o->link) {
    credit(*o, p.waiting_bytes);
    o->link->send(relay_wire::nack_frame(relay_subject::payload, p.id, where_ + ": " + why));
  }
  stats_.buffered_bytes -= p.waiting_bytes;
  p.waiting.clear();
  p.waiting_bytes = 0;
  if (current_) current_->payloads.erase(p.id);
}

DCR_NETWORK_INLINE void relay_root::reserve() {
  while (!fifo_.empty()) {
    auto p = fifo_.front();
    if (p->dropped) {
      fifo_.pop_front();
      continue;
    }
    bool fits = true;
    for (auto k : p->targets) {
      const auto& n = *nodes_[k];
      if (!n.link) continue;  // lost: break_attempt drops the queue
      fits = fits && (n.outstanding == 0 || n.outstanding + p->total <= n.window);
    }
    if (!fits) return;
    fifo_.pop_front();
    p->reserved = true;
    for (auto k : p->targets) nodes_[k]->outstanding += p->total;
    auto o = p->owner.lock();
    for (auto& f : p->waiting) forward(*p, f);
    if (o) credit(*o, p->waiting_bytes);
    stats_.buffered_bytes -= p->waiting_bytes;
    p->waiting.clear();
    p->waiting_bytes = 0;
  }
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
