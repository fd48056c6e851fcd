// dcr/detail/protocol/relay/relay_owner.inl: the bodies of dcr/protocol/relay/relay_owner.hpp (included at its
// end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr {

DCR_NETWORK_INLINE relay_owner_store::relay_owner_store(relay_owner_options options)
    : options_(std::move(options)), ctx_(relay_detail::make_context(options_.tls, false)) {
  DCR_EXPECTS(!options_.roots.empty(), errc::invalid_argument,
              options_.name + ": no relay roots given");
  DCR_EXPECTS(options_.chunk_bytes >= 1 && options_.chunk_bytes <= relay_wire::max_body_bytes - 256,
              errc::invalid_argument,
              options_.name + ": chunk_bytes must be between 1 byte and 16 MiB");
  roots_.resize(options_.roots.size());
  for (std::size_t r = 0; r < roots_.size(); ++r) roots_[r].at = options_.roots[r];
  stats_.bytes_sent.assign(roots_.size(), 0);
}

DCR_NETWORK_INLINE relay_owner_store::~relay_owner_store() {
  io_.stop([this] {
    std::lock_guard lock(mutex_);
    for (auto& r : roots_) {
      if (r.link) r.link->close("owner shutting down");
      r.link.reset();
    }
  });
}

DCR_NETWORK_INLINE std::size_t relay_owner_store::root_of(const payload_id& id, std::size_t roots) noexcept {
  return (static_cast<std::size_t>(id.owner) + id.sequence) % roots;
}

DCR_NETWORK_INLINE void relay_owner_store::open_attempt(const attempt_key& key,
                                            std::span<const std::string> receivers,
                                            protocol_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  key_ = key;
  deadline_ = deadline;
  sent_.clear();
  acked_.clear();
  failure_.clear();
  manifest_acked_ = false;
  for (auto& r : roots_) {
    r.ready = false;
    r.carrying = 0;
  }
  for (std::size_t r = 0; r < roots_.size(); ++r) connect(r, lock);
  const auto frame = relay_wire::attempt_frame(key, receivers);
  for (std::size_t r = 0; r < roots_.size(); ++r) send(r, frame, lock);
  wait(lock,
       "the roots to answer that the receivers of " + relay_wire::describe(key) + " are reachable",
       [&] {
         // A root lost after the announcement (it died as the frame went out) never answers.
         for (const auto& r : roots_) throw_if_lost(r);
         return std::all_of(roots_.begin(), roots_.end(),
                            [](const root_state& r) { return r.ready; });
       });
}

DCR_NETWORK_INLINE void relay_owner_store::put(const payload_id& id, std::span<const std::byte> bytes) {
  std::unique_lock lock(mutex_);
  DCR_EXPECTS(key_ && id.attempt == *key_, errc::not_ready,
              options_.name + ": put of a " + relay_wire::describe(id) +
                  " outside its open attempt (open_attempt first)");
  const auto hash = XXH64(bytes.data(), bytes.size(), bytes.size());
  if (auto it = sent_.find(id); it != sent_.end()) {
    DCR_EXPECTS(it->second == hash, errc::transport_failure,
                options_.name + ": " + relay_wire::describe(id) + " put again with other bytes");
    return;
  }
  throw_if_failed();
  const std::size_t r = root_of(id, roots_.size());
  auto& root = roots_[r];
  const std::uint64_t total = bytes.size();
  std::uint64_t offset = 0;
  do {
    const std::uint64_t n = std::min<std::uint64_t>(total - offset, root.chunk);
    wait(lock, "credit from root " + root.at.text(), [&] {
      throw_if_lost(root);
      return root.credit >= static_cast<std::int64_t>(n);
    });
    root.credit -= static_cast<std::int64_t>(n);
    auto frame = relay_wire::chunk_frame(id, total, offset, bytes.subspan(offset, n));
    send(r, frame, lock);
    offset += n;
  } while (offset < total);
  sent_[id] = hash;
  ++root.carrying;
  ++stats_.payloads;
}

DCR_NETWORK_INLINE void relay_owner_store::put_manifest(const attempt_key& key, std::uint32_t owner,
                                            std::span<const payload_id> ids) {
  std::unique_lock lock(mutex_);
  DCR_EXPECTS(
      key_ && key == *key_, errc::not_ready,
      options_.name + ": manifest of " + relay_wire::describe(key) + " outside its open attempt");
  for (const auto& id : ids)
    DCR_EXPECTS(id.attempt == key && id.owner == owner && sent_.contains(id),
                errc::transport_failure,
                options_.name + ": manifest of owner " + std::to_string(owner) +
                    " lists a payload that was not put for its attempt");
  manifest_owner_ = owner;
  const std::size_t m = manifest_root_of(owner, roots_.size());
  throw_if_failed();
  throw_if_lost(roots_[m]);
  ++roots_[m].carrying;
  send(m, relay_wire::manifest_frame(key, owner, ids), lock);
  wait(lock,
       "acknowledgements of " + std::to_string(ids.size()) + " payloads and the manifest of " +
           relay_wire::describe(key),
       [&] {
         throw_if_failed();
         if (manifest_acked_ && acked_.size() >= sent_.size()) return true;
         for (auto& r : roots_)
           if (r.carrying > 0) throw_if_lost(r);
         return false;
       });
}

DCR_NETWORK_INLINE relay_owner_stats relay_owner_store::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

DCR_NETWORK_INLINE void relay_owner_store::throw_if_failed() const {
  DCR_EXPECTS(failure_.empty(), errc::transport_failure, options_.name + ": " + failure_);
}

DCR_NETWORK_INLINE void relay_owner_store::throw_if_lost(const root_state& r) const {
  DCR_EXPECTS(r.alive, errc::transport_failure,
              options_.name + ": root " + r.at.text() + " lost: " + r.error);
}

DCR_NETWORK_INLINE void relay_owner_store::connect(std::size_t r, std::unique_lock<std::mutex>& lock) {
  auto& root = roots_[r];
  if (root.alive) return;
  const auto attempt_left = deadline_ - protocol_clock::now();
  const auto deadline =
      std::chrono::steady_clock::now() +
      (attempt_left < options_.connect_timeout
           ? std::chrono::duration_cast<std::chrono::steady_clock::duration>(attempt_left)
           : std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.connect_timeout));
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    DCR_EXPECTS(left.count() > 0, errc::transport_failure,
                options_.name + ": cannot connect to root " + root.at.text() + " within " +
                    std::to_string(options_.connect_timeout.count()) +
                    " ms or the attempt's deadline" + (root.error.empty() ? "" : ": " + root.error));
    // One try never outlasts what is left: its timer ends it whatever it waits for.
    const auto timeout = std::min(options_.handshake_timeout, left);
    std::promise<std::pair<std::shared_ptr<relay_link>, std::pair<std::string, bool>>> result;
    auto future = result.get_future();
    lock.unlock();
    asio::post(io_.io(), [&] {
      auto e = std::make_shared<relay_detail::establishing>(
          io_.io(), ctx_, relay_hello{relay_role::owner, 0, options_.name}, timeout,
          [&result](std::shared_ptr<relay_link> link, const std::string& err, bool unreachable) {
            result.set_value({std::move(link), {err, unreachable}});
          },
          options_.heartbeat);
      e->dial(root.at, "root", relay_role::root);
    });
    auto [link, err] = future.get();
    lock.lock();
    if (link) {
      attach(r, std::move(link), lock);
      return;
    }
    root.error = err.first;
    DCR_EXPECTS(err.second && std::chrono::steady_clock::now() + pause < deadline,
                errc::transport_failure, options_.name + ": " + err.first);
    lock.unlock();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
    lock.lock();
  }
}

DCR_NETWORK_INLINE void relay_owner_store::attach(std::size_t r, std::shared_ptr<relay_link> link,
                                      std::unique_lock<std::mutex>& lock) {
  auto& root = roots_[r];
  root.link = link;
  root.alive = true;
  root.error.clear();
  root.credit = static_cast<std::int64_t>(link->hello().window);
  root.chunk = std::max<std::uint64_t>(
      1, std::min<std::uint64_t>(options_.chunk_bytes, link->hello().window));
  ++stats_.connects;
  lock.unlock();
  std::weak_ptr<relay_link> weak = link;
  asio::post(io_.io(), [this, r, link, weak] {
    link->start(
        [this, r, weak](relay_frame t, const relay_wire::frame_ptr& f) { on_frame(r, weak, t, f); },
        [this, r, weak](const std::string& why) { on_lost(r, weak, why); });
  });
  lock.lock();
}

DCR_NETWORK_INLINE void relay_owner_store::send(std::size_t r, relay_wire::frame_ptr frame,
                                    std::unique_lock<std::mutex>& lock) {
  auto link = roots_[r].link;
  stats_.bytes_sent[r] += frame->size();
  lock.unlock();
  if (r < options_.flows.size() && options_.flows[r] != nullptr) {
    constexpr std::size_t piece = 64 * 1024;
    for (std::size_t done = 0; done < frame->size(); done += piece)
      options_.flows[r]->consume(std::min(piece, frame->size() - done));
  }
  asio::post(io_.io(), [link, frame = std::move(frame)] {
    if (link) link->send(frame);
  });
  lock.lock();
}

DCR_NETWORK_INLINE void relay_owner_store::on_lost(std::size_t r, const std::weak_ptr<relay_link>& weak,
                                       const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    auto& root = roots_[r];
    if (root.link != weak.lock() && root.link) return;
    root.alive = false;
    root.error = why;
    // Whatever any owner streamed through it in this attempt is lost: the attempt fails now,
    // not at its deadline (a later open_attempt reconnects).
    if (key_ && failure_.empty())
      failure_ = "root " + root.at.text() + " lost during " + relay_wire::describe(*key_) + ": " + why;
    ++progress_;
  }
  wake_.notify_all();
}

DCR_NETWORK_INLINE void relay_owner_store::on_frame(std::size_t r, const std::weak_ptr<relay_link>& weak,
                                        relay_frame type, const relay_wire::frame_ptr& frame) {
  const std::span<const std::byte> body(frame->data() + relay_wire::header_bytes,
                                        frame->size() - relay_wire::header_bytes);
  relay_wire::reader rd(body, type);
  {
    std::lock_guard lock(mutex_);
    auto& root = roots_[r];
    if (root.link != weak.lock()) return;
    ++progress_;
    switch (type) {
      case relay_frame::credit:
        root.credit += static_cast<std::int64_t>(rd.u64());
        break;
      case relay_frame::ready:
        if (key_ && rd.key() == *key_) root.ready = true;
        break;
      case relay_frame::ack: {
        const auto what = static_cast<relay_subject>(rd.u8());
        const auto id = rd.id();
        if (!key_ || id.attempt != *key_) break;
        if (what == relay_subject::payload) acked_.insert(id);
        if (what == relay_subject::manifest && id.owner == manifest_owner_) manifest_acked_ = true;
        break;
      }
      case relay_frame::nack: {
        const auto what = static_cast<relay_subject>(rd.u8());
        const auto id = rd.id();
        const auto why = rd.str();
        if (!key_ || id.attempt != *key_) break;
        if (failure_.empty())
          failure_ =
              (what == relay_subject::payload ? relay_wire::describe(id) + " was not delivered: "
               : what == relay_subject::manifest
                   ? "the manifest of " + relay_wire::describe(*key_) + " was not delivered: "
                   : relay_wire::describe(*key_) + " cannot be relayed: ") +
              why;
        break;
      }
      default:
        throw error(
            errc::corrupt_payload,
            "unexpected frame type " + std::to_string(static_cast<int>(type)) + " from a root");
    }
  }
  wake_.notify_all();
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
