// dcr/detail/protocol/relay/relay_link.inl: the bodies of dcr/protocol/relay/relay_link.hpp (included at its
// end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr::relay_wire {

DCR_NETWORK_INLINE writer::writer(relay_frame type, std::size_t reserve) {
  bytes_.reserve(header_bytes + reserve);
  bytes_.assign(header_bytes, std::byte{0});  // reserved fields zero (resize would leave them)
  bytes_[0] = static_cast<std::byte>(type);
}

DCR_NETWORK_INLINE writer& writer::str(std::string_view s) {
  DCR_EXPECTS(s.size() <= 0xffff, errc::overflow, "relay: string field longer than 65535 bytes");
  u16(static_cast<std::uint16_t>(s.size()));
  return raw(s.data(), s.size());
}

DCR_NETWORK_INLINE writer& writer::id(const payload_id& p) {
  return key(p.attempt).u32(p.owner).u32(p.sequence);
}

DCR_NETWORK_INLINE writer& writer::raw(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
  return *this;
}

DCR_NETWORK_INLINE frame_ptr writer::done() {
  const auto body = bytes_.size() - header_bytes;
  DCR_EXPECTS(body <= max_body_bytes, errc::overflow, "relay: frame body too large");
  const auto n = static_cast<std::uint32_t>(body);
  for (int i = 0; i < 4; ++i) bytes_[4 + i] = static_cast<std::byte>(n >> (8 * i));
  return std::make_shared<const buffer>(std::move(bytes_));
}

DCR_NETWORK_INLINE std::string reader::str() {
  const auto n = u16();
  const auto s = take(n);
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

DCR_NETWORK_INLINE attempt_key reader::key() {
  attempt_key k;
  k.base_version = u64();
  k.target_version = u64();
  k.number = u32();
  return k;
}

DCR_NETWORK_INLINE payload_id reader::id() {
  const auto k = key();
  payload_id p{k, 0, 0};
  p.owner = u32();
  p.sequence = u32();
  return p;
}

DCR_NETWORK_INLINE std::uint32_t reader::count(std::size_t item_bytes, std::uint32_t limit, const char* what) {
  const auto n = u32();
  const std::size_t left = body_.size() - at_;
  DCR_EXPECTS(n <= limit && n <= left / std::max<std::size_t>(item_bytes, 1), errc::corrupt_payload,
              "relay: frame type " + std::to_string(static_cast<int>(type_)) + " claims " +
                  std::to_string(n) + " " + what + " in " + std::to_string(left) +
                  " remaining bytes (at most " + std::to_string(limit) + ")");
  return n;
}

DCR_NETWORK_INLINE void reader::end() const {
  DCR_EXPECTS(at_ == body_.size(), errc::corrupt_payload,
              "relay: " + std::to_string(body_.size() - at_) +
                  " unexpected bytes after frame type " + std::to_string(static_cast<int>(type_)));
}

DCR_NETWORK_INLINE std::span<const std::byte> reader::take(std::size_t n) {
  DCR_EXPECTS(n <= body_.size() - at_, errc::corrupt_payload,
              "relay: frame type " + std::to_string(static_cast<int>(type_)) + " truncated");
  auto s = body_.subspan(at_, n);
  at_ += n;
  return s;
}

}  // namespace dcr::relay_wire

namespace dcr {

DCR_NETWORK_INLINE void relay_link::start(frame_handler on_frame, close_handler on_close) {
  on_frame_ = std::move(on_frame);
  on_close_ = std::move(on_close);
  last_read_ = last_write_ = std::chrono::steady_clock::now();
  read_header();
  if (heartbeat_.interval.count() > 0 || heartbeat_.timeout.count() > 0) beat();
}

DCR_NETWORK_INLINE void relay_link::send(frame_ptr frame) {
  if (closed_) return;
  queued_bytes_ += frame->size();
  out_.push_back(std::move(frame));
  if (!writing_) write_some();
}

DCR_NETWORK_INLINE void relay_link::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  reason_ = reason;
  asio::error_code ec;
  stream_.lowest_layer().close(ec);
  beat_.cancel();
  out_.clear();
  queued_bytes_ = 0;
  if (on_close_) {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->on_close_) self->on_close_(self->reason_);
      self->on_close_ = nullptr;
      self->on_frame_ = nullptr;
    });
  }
}

DCR_NETWORK_INLINE void relay_link::beat() {
  using std::chrono::milliseconds;
  const auto now = std::chrono::steady_clock::now();
  const auto silent = std::chrono::duration_cast<milliseconds>(now - last_read_);
  if (heartbeat_.timeout.count() > 0 && silent >= heartbeat_.timeout)
    return close("no frame from " + peer_ + " for " + std::to_string(silent.count()) +
                 " ms (heartbeat timeout " + std::to_string(heartbeat_.timeout.count()) +
                 " ms): it is frozen or gone");
  // Nothing queued or being written for an interval: say this side is alive. (Queued frames say
  // it themselves; a write stuck behind a peer that does not read is that peer's silence.)
  if (heartbeat_.interval.count() > 0 && !writing_ && out_.empty() &&
      now - last_write_ >= heartbeat_.interval)
    send(relay_wire::writer(relay_frame::heartbeat, 0).done());
  auto tick = heartbeat_.interval.count() > 0 ? heartbeat_.interval : heartbeat_.timeout;
  if (heartbeat_.timeout.count() > 0) tick = std::min(tick, heartbeat_.timeout);
  beat_.expires_after(std::max(milliseconds(5), tick / 2));
  beat_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (!ec && !self->closed_) self->beat();
  });
}

DCR_NETWORK_INLINE void relay_link::read_header() {
  asio::async_read(stream_, asio::buffer(header_),
                   [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
                     if (ec) return self->fail("reading from", ec);
                     self->last_read_ = std::chrono::steady_clock::now();
                     self->read_body();
                   });
}

DCR_NETWORK_INLINE void relay_link::read_body() {
  const auto type = static_cast<relay_frame>(header_[0]);
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(header_[4 + i]) << (8 * i);
  if (header_[1] != 0 || header_[2] != 0 || header_[3] != 0)
    return close("malformed frame from " + peer_ + " (reserved header bits set)");
  if (n > relay_wire::max_body_bytes)
    return close("malformed frame from " + peer_ + " (body of " + std::to_string(n) + " bytes)");
  if (type == relay_frame::heartbeat) {
    if (n != 0)
      return close("malformed frame from " + peer_ + " (a heartbeat with a body of " +
                   std::to_string(n) + " bytes)");
    return read_header();
  }
  auto frame = std::make_shared<relay_wire::buffer>(relay_wire::header_bytes + n);
  std::memcpy(frame->data(), header_.data(), relay_wire::header_bytes);
  auto* body = frame->data() + relay_wire::header_bytes;
  asio::async_read(
      stream_, asio::buffer(body, n),
      [self = shared_from_this(), frame, type](const asio::error_code& ec, std::size_t) {
        if (ec) return self->fail("reading from", ec);
        if (self->closed_) return;
        self->last_read_ = std::chrono::steady_clock::now();
        try {
          if (self->on_frame_) self->on_frame_(type, frame);
        } catch (const std::exception& e) {
          return self->close("bad frame from " + self->peer_ + ": " + e.what());
        }
        if (!self->closed_) self->read_header();
      });
}

DCR_NETWORK_INLINE void relay_link::write_some() {
  if (out_.empty() || closed_) return;
  writing_ = true;
  last_write_ = std::chrono::steady_clock::now();
  batch_.clear();
  std::size_t n = 0, bytes = 0;
  for (const auto& f : out_) {
    if (n == 16 || (n > 0 && bytes + f->size() > (std::size_t{4} << 20))) break;
    batch_.emplace_back(f->data(), f->size());
    bytes += f->size();
    ++n;
  }
  asio::async_write(stream_, batch_,
                    [self = shared_from_this(), n, bytes](const asio::error_code& ec, std::size_t) {
                      self->writing_ = false;
                      if (ec) return self->fail("writing to", ec);
                      if (self->closed_) return;
                      self->last_write_ = std::chrono::steady_clock::now();
                      for (std::size_t i = 0; i < n; ++i) self->out_.pop_front();
                      self->queued_bytes_ -= bytes;
                      self->written_ += bytes;
                      self->write_some();
                    });
}

DCR_NETWORK_INLINE void relay_link::fail(const char* op, const asio::error_code& ec) {
  if (closed_) return;
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
      ec == asio::error::connection_reset)
    close("connection closed by " + peer_ +
          (ec == asio::error::connection_reset ? " (reset)" : ""));
  else
    close(std::string(op) + " " + peer_ + " failed: " + ec.message());
}

}  // namespace dcr

namespace dcr::relay_detail {

DCR_NETWORK_INLINE void establishing::dial(const relay_endpoint& to, std::string what,
                               std::optional<relay_role> expect) {
  server_ = false;
  peer_ = to.text();
  what_ = std::move(what);
  expect_ = expect;
  stage_ = stage::resolving;
  expect_server_name(stream_, to.host);
  arm();
  resolver_ = std::make_shared<tcp::resolver>(stream_.get_executor());
  resolver_->async_resolve(
      to.host, std::to_string(to.port),
      [self = shared_from_this()](const asio::error_code& ec, tcp::resolver::results_type r) {
        if (self->finished_) return;
        if (ec)
          return self->finish(
              "cannot resolve " + self->what_ + " " + self->peer_ + ": " + ec.message(), true);
        self->stage_ = stage::connecting;
        asio::async_connect(
            self->socket(), r, [self](const asio::error_code& ec2, const tcp::endpoint&) {
              if (self->finished_) return;
              if (ec2)
                return self->finish(
                    "cannot connect to " + self->what_ + " " + self->peer_ + ": " + self->why(ec2),
                    true);
              asio::error_code ignored;
              self->socket().set_option(tcp::no_delay(true), ignored);
              self->stage_ = stage::handshaking;
              self->stream_.async_handshake(
                  asio::ssl::stream_base::client, [self](const asio::error_code& ec3) {
                    if (self->finished_) return;
                    if (ec3) {
                      const long code = SSL_get_verify_result(self->stream_.native_handle());
                      const auto v = verify_failure(self->stream_);
                      const bool misnamed = code == X509_V_ERR_HOSTNAME_MISMATCH ||
                                            code == X509_V_ERR_IP_ADDRESS_MISMATCH;
                      // Closed before the handshake completed, with no alert and no verdict of
                      // ours: the server dropped the connection (restarting, or shedding a
                      // flood of pending handshakes), not refused this peer: worth retrying.
                      const bool dropped = v.empty() && (ec3 == asio::error::eof ||
                                                         ec3 == asio::ssl::error::stream_truncated ||
                                                         ec3 == asio::error::connection_reset);
                      return self->finish(
                          "TLS handshake with " + self->what_ + " " + self->peer_ + " failed: " +
                              self->why(ec3) +
                              (v.empty() ? ""
                               : misnamed
                                   ? " (" + v + ": its certificate is not issued for the address " +
                                         self->peer_.substr(0, self->peer_.rfind(':')) + ")"
                                   : " (" + v +
                                         ": its certificate is not signed by this deployment's CA)"),
                          dropped);
                    }
                    if (!self->check_certificate_role()) return;
                    self->stage_ = stage::hello;
                    self->send_hello([self] { self->read_hello(); });
                  });
            });
      });
}

DCR_NETWORK_INLINE void establishing::accept(std::string where, std::vector<relay_role> accepted) {
  server_ = true;
  peer_ = remote_text(socket());
  what_ = std::move(where);
  accepted_ = std::move(accepted);
  asio::error_code ignored;
  socket().set_option(tcp::no_delay(true), ignored);
  stage_ = stage::handshaking;
  arm();
  stream_.async_handshake(asio::ssl::stream_base::server,
                          [self = shared_from_this()](const asio::error_code& ec) {
                            if (self->finished_) return;
                            if (ec) {
                              const auto v = verify_failure(self->stream_);
                              return self->finish(self->refused_peer() +
                                                  ": TLS handshake failed: " + self->why(ec) +
                                                  (v.empty() ? "" : " (" + v + ")"));
                            }
                            if (!self->check_certificate_role()) return;
                            self->stage_ = stage::hello;
                            self->read_hello();
                          });
}

DCR_NETWORK_INLINE void establishing::abandon(const std::string& why) { finish(why); }

DCR_NETWORK_INLINE std::string establishing::why(const asio::error_code& ec) const {
  if (timed_out_) return "timed out after " + std::to_string(timeout_.count()) + " ms";
  return ec.message();
}

DCR_NETWORK_INLINE std::string establishing::refused_peer() const { return what_ + ": refused peer " + peer_; }

DCR_NETWORK_INLINE void establishing::arm() {
  timer_.expires_after(timeout_);
  timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (ec || self->finished_) return;
    self->timed_out();
  });
}

// The timer ends the establishment itself: a resolver (whose lookup may never return) or a
// peer that never answers cannot hold it past its timeout.
DCR_NETWORK_INLINE void establishing::timed_out() {
  timed_out_ = true;
  if (resolver_) resolver_->cancel();
  const asio::error_code none;
  switch (stage_) {
    case stage::resolving:
      return finish("cannot resolve " + what_ + " " + peer_ + ": " + why(none), true);
    case stage::connecting:
      return finish("cannot connect to " + what_ + " " + peer_ + ": " + why(none), true);
    case stage::handshaking:
      return finish(server_ ? refused_peer() + ": TLS handshake failed: " + why(none)
                            : "TLS handshake with " + what_ + " " + peer_ + " failed: " + why(none));
    case stage::hello:
      return finish(refused_text(none));
  }
}

DCR_NETWORK_INLINE std::string establishing::refused_text(const asio::error_code& ec) const {
  if (server_) return what_ + ": peer " + peer_ + " went away during the hello: " + why(ec);
  // TLS 1.3: the server's verdict on our certificate arrives as an alert on the first read.
  return what_ + " " + peer_ + " refused this peer after the TLS handshake: " + why(ec) +
         " (is this peer's certificate signed by the deployment's CA, and does it grant the "
         "role " + relay_role_name(mine_.role) + "?)";
}

namespace detail {
DCR_NETWORK_INLINE std::string with_article(relay_role r) {
  return (r == relay_role::owner ? "an " : "a ") + std::string(relay_role_name(r));
}
}  // namespace detail

DCR_NETWORK_INLINE bool establishing::check_certificate_role() {
  std::string problem;
  peer_cn_ = peer_common_name(stream_);
  cert_role_ = peer_certificate_role(stream_, problem);
  if (server_) {
    // Judged with the hello, so that the refusal names the role the peer claims as well.
    role_problem_ = problem;
    return true;
  }
  const std::string cert = "its certificate (CN=" + peer_cn_ + ")";
  if (!cert_role_) {
    finish(what_ + " " + peer_ + " refused: " + cert + " " + problem);
    return false;
  }
  if (expect_ && *cert_role_ != *expect_) {
    finish(what_ + " " + peer_ + " refused: it is dialed as " + detail::with_article(*expect_) +
           ", but " + cert + " grants the role " + relay_role_name(*cert_role_));
    return false;
  }
  return true;
}

DCR_NETWORK_INLINE std::string establishing::role_refusal(relay_role claimed) const {
  const std::string cert = "its certificate (CN=" + peer_cn_ + ")";
  const std::string who = server_ ? refused_peer() : what_ + " " + peer_ + " refused";
  if (!cert_role_)
    return who + ": it claims to be " + detail::with_article(claimed) + ", but " + cert + " " +
           role_problem_;
  if (claimed != *cert_role_)
    return who + ": it claims to be " + detail::with_article(claimed) + ", but " + cert +
           " grants the role " + relay_role_name(*cert_role_);
  if (server_ && std::find(accepted_.begin(), accepted_.end(), claimed) == accepted_.end())
    return who + ": it is " + detail::with_article(claimed) + " (" + cert +
           " grants that role), and " + detail::with_article(claimed) + " does not connect here";
  return {};
}

DCR_NETWORK_INLINE void establishing::read_hello() {
  asio::async_read(
      stream_, asio::buffer(header_),
      [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
        if (self->finished_) return;
        if (ec) return self->finish(self->refused_text(ec));
        std::uint32_t n = 0;
        for (int i = 0; i < 4; ++i)
          n |= static_cast<std::uint32_t>(self->header_[4 + i]) << (8 * i);
        if (static_cast<relay_frame>(self->header_[0]) != relay_frame::hello || n > 4096)
          return self->finish(self->what_ + (self->server_ ? ": refused peer " : " ") +
                              self->peer_ + ": the first frame is not a relay hello");
        self->body_.resize(n);
        asio::async_read(
            self->stream_, asio::buffer(self->body_),
            [self](const asio::error_code& ec2, std::size_t) {
              if (self->finished_) return;
              if (ec2) return self->finish(self->refused_text(ec2));
              relay_hello theirs;
              try {
                theirs = relay_wire::parse_hello(self->body_);
              } catch (const error& e) {
                return self->finish(self->what_ + (self->server_ ? ": refused peer " : " ") +
                                    self->peer_ + ": " + e.what());
              }
              // The role is the certificate's: a hello claiming another is refused, naming both.
              if (auto refusal = self->role_refusal(theirs.role); !refusal.empty())
                return self->finish(refusal);
              self->theirs_ = std::move(theirs);
              if (self->server_)
                self->send_hello([self] { self->succeed(); });
              else
                self->succeed();
            });
      });
}

DCR_NETWORK_INLINE void establishing::succeed() {
  if (finished_) return;
  finished_ = true;
  timer_.cancel();
  auto link = std::make_shared<relay_link>(std::move(stream_), peer_, theirs_, peer_cn_, heartbeat_);
  done_(std::move(link), {}, false);
}

DCR_NETWORK_INLINE void establishing::finish(const std::string& err, bool unreachable) {
  if (finished_) return;
  finished_ = true;
  timer_.cancel();
  if (resolver_) resolver_->cancel();
  asio::error_code ignored;
  socket().close(ignored);
  done_(nullptr, err, unreachable);
}

DCR_NETWORK_INLINE listener::listener(asio::io_context& io, asio::ssl::context& ctx, const relay_endpoint& at,
                          std::string what, std::vector<relay_role> accepted, relay_hello mine,
                          std::chrono::milliseconds timeout, link_handler on_link,
                          refusal_handler on_refused, relay_accept_limits limits,
                          relay_heartbeat heartbeat)
    : io_(&io),
      ctx_(&ctx),
      acceptor_(io),
      backoff_(io),
      accepted_(std::move(accepted)),
      mine_(std::move(mine)),
      timeout_(timeout),
      on_link_(std::move(on_link)),
      on_refused_(std::move(on_refused)),
      limits_(limits),
      heartbeat_(heartbeat) {
  DCR_EXPECTS(limits_.pending >= 1 && limits_.per_address >= 1, errc::invalid_argument,
              what + ": the pending handshake limits must be at least 1");
  asio::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(at.host, std::to_string(at.port), ec);
  DCR_EXPECTS(!ec && !results.empty(), errc::transport_failure,
              what + ": cannot resolve listening address " + at.text() + ": " + ec.message());
  const tcp::endpoint ep = *results.begin();
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  DCR_EXPECTS(!ec, errc::transport_failure,
              what + ": cannot listen on " + at.text() + ": " + ec.message());
  bound_ = relay_endpoint{ep.address().to_string(), acceptor_.local_endpoint().port()};
  what_ = what + " " + bound_.text();
}

DCR_NETWORK_INLINE void listener::close() {
  asio::error_code ec;
  acceptor_.close(ec);
  backoff_.cancel();
  // Moved out first: abandoning one runs its done handler, which erases it from pending_.
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) p.e->abandon(what_ + ": shutting down");
}

DCR_NETWORK_INLINE void listener::accept_next() {
  const auto id = next_id_++;
  auto e = std::make_shared<establishing>(
      *io_, *ctx_, mine_, timeout_,
      [this, id](std::shared_ptr<relay_link> link, const std::string& err, bool) {
        // Not pending any more: dropped for a newer connection (reported by drop_oldest).
        if (pending_.erase(id) == 0 && !link) return;
        if (link)
          on_link_(std::move(link));
        else
          on_refused_(err);
      },
      heartbeat_);
  acceptor_.async_accept(e->socket(), [this, e, id](const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Re-arming at once would spin on an error that persists (EMFILE: out of descriptors).
      ++accept_errors_;
      pause_ = pause_.count() == 0 ? std::chrono::milliseconds(10)
                                   : std::min(pause_ * 2, std::chrono::milliseconds(1000));
      if (ec.message() != last_accept_error_) {
        last_accept_error_ = ec.message();
        on_refused_(what_ + ": cannot accept a connection: " + ec.message() +
                    " (retrying, backing off up to 1 s)");
      }
      // Out of descriptors: the oldest pending handshake gives its descriptor to a newer peer.
      if (ec == asio::error::no_descriptors && !pending_.empty()) drop_oldest(nullptr);
      backoff_.expires_after(pause_);
      backoff_.async_wait([this](const asio::error_code& ec2) {
        if (!ec2 && acceptor_.is_open()) accept_next();
      });
      return;
    }
    pause_ = std::chrono::milliseconds(0);
    last_accept_error_.clear();
    asio::error_code ignored;
    const auto from = e->socket().remote_endpoint(ignored);
    admit(id, e, ignored ? std::string("unknown address") : from.address().to_string());
    accept_next();
  });
}

DCR_NETWORK_INLINE void listener::admit(std::uint64_t id, std::shared_ptr<establishing> e, std::string address) {
  pending_.emplace(id, pending_handshake{e, address});
  const auto from = static_cast<std::size_t>(std::count_if(
      pending_.begin(), pending_.end(), [&](const auto& p) { return p.second.address == address; }));
  if (from > limits_.per_address) drop_oldest(&address);
  if (pending_.size() > limits_.pending) drop_oldest(nullptr);
  peak_pending_ = std::max(peak_pending_, pending_.size());
  e->accept(what_, accepted_);
}

DCR_NETWORK_INLINE void listener::drop_oldest(const std::string* address) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) {
    return address == nullptr || p.second.address == *address;
  });
  if (it == pending_.end()) return;
  auto e = std::move(it->second.e);
  pending_.erase(it);
  ++dropped_;
  ++dropped_unreported_;
  const auto why =
      address != nullptr
          ? "more than " + std::to_string(limits_.per_address) + " pending from " + *address
          : "more than " + std::to_string(limits_.pending) + " pending";
  const auto peer = e->peer();
  e->abandon(what_ + ": dropped the pending handshake of " + peer + " (" + why + ")");
  const auto now = std::chrono::steady_clock::now();
  if (now - last_drop_report_ >= std::chrono::seconds(1)) {
    on_refused_(what_ + ": dropped " + std::to_string(dropped_unreported_) +
                " pending handshake(s) for newer connections, the latest of peer " + peer + " (" +
                why + ")");
    dropped_unreported_ = 0;
    last_drop_report_ = now;
  }
}

DCR_NETWORK_INLINE void io_thread::stop(std::function<void()> last) {
  if (!thread_.joinable()) return;
  if (last) call([&] { last(); });
  work_.reset();
  io_.stop();
  thread_.join();
}

}  // namespace dcr::relay_detail

namespace dcr {

DCR_NETWORK_INLINE const char* relay_role_name(relay_role r) {
  switch (r) {
    case relay_role::owner:
      return "owner";
    case relay_role::root:
      return "root";
    case relay_role::node:
      return "node";
  }
  return "unknown peer";
}

DCR_NETWORK_INLINE std::string relay_role_unit(relay_role r) { return std::string("dcr-relay-") + relay_role_name(r); }

}  // namespace dcr

namespace dcr::relay_wire {

DCR_NETWORK_INLINE frame_ptr hello_frame(const relay_hello& h) {
  return writer(relay_frame::hello)
      .u32(magic)
      .u16(version)
      .u8(static_cast<std::uint8_t>(h.role))
      .u8(0)
      .u64(h.window)
      .str(h.name)
      .done();
}

DCR_NETWORK_INLINE relay_hello parse_hello(std::span<const std::byte> body) {
  reader r(body, relay_frame::hello);
  DCR_EXPECTS(r.u32() == magic, errc::corrupt_payload,
              "relay: not a dcr relay peer (bad hello magic)");
  const auto v = r.u16();
  DCR_EXPECTS(v == version, errc::unsupported_version,
              "relay: peer speaks relay protocol version " + std::to_string(v) + ", this side " +
                  std::to_string(version));
  relay_hello h;
  const auto role = r.u8();
  DCR_EXPECTS(role >= 1 && role <= 3, errc::corrupt_payload, "relay: unknown role in hello");
  h.role = static_cast<relay_role>(role);
  DCR_EXPECTS(r.u8() == 0, errc::reserved_bits_set, "relay: reserved hello field set");
  h.window = r.u64();
  h.name = r.str();
  r.end();
  return h;
}

DCR_NETWORK_INLINE frame_ptr ack_frame(relay_subject what, const payload_id& id) {
  return writer(relay_frame::ack).u8(static_cast<std::uint8_t>(what)).id(id).done();
}

DCR_NETWORK_INLINE frame_ptr nack_frame(relay_subject what, const payload_id& id, std::string_view reason) {
  return writer(relay_frame::nack, 64 + reason.size())
      .u8(static_cast<std::uint8_t>(what))
      .id(id)
      .str(reason.substr(0, 4000))
      .done();
}

DCR_NETWORK_INLINE frame_ptr attempt_frame(const attempt_key& key, std::span<const std::string> receivers) {
  writer w(relay_frame::attempt);
  w.key(key).u32(static_cast<std::uint32_t>(receivers.size()));
  for (const auto& r : receivers) w.str(r);
  return w.done();
}

DCR_NETWORK_INLINE frame_ptr receivers_frame(std::span<const std::string> names) {
  writer w(relay_frame::receivers);
  w.u32(static_cast<std::uint32_t>(names.size()));
  for (const auto& n : names) w.str(n);
  return w.done();
}

DCR_NETWORK_INLINE frame_ptr manifest_frame(const attempt_key& key, std::uint32_t owner,
                                std::span<const payload_id> ids) {
  writer w(relay_frame::manifest, 24 + 4 * ids.size());
  w.key(key).u32(owner).u32(static_cast<std::uint32_t>(ids.size()));
  for (const auto& id : ids) w.u32(id.sequence);
  return w.done();
}

DCR_NETWORK_INLINE frame_ptr chunk_frame(const payload_id& id, std::uint64_t total, std::uint64_t offset,
                             std::span<const std::byte> data) {
  return writer(relay_frame::chunk, 48 + data.size())
      .id(id)
      .u64(total)
      .u64(offset)
      .raw(data.data(), data.size())
      .done();
}

DCR_NETWORK_INLINE chunk_view parse_chunk(std::span<const std::byte> body) {
  reader r(body, relay_frame::chunk);
  chunk_view c;
  c.id = r.id();
  c.total = r.u64();
  c.offset = r.u64();
  c.data = r.rest();
  DCR_EXPECTS(c.offset <= c.total && c.data.size() <= c.total - c.offset, errc::corrupt_payload,
              "relay: chunk of payload (owner " + std::to_string(c.id.owner) + ", sequence " +
                  std::to_string(c.id.sequence) + ") lies outside its payload");
  return c;
}

}  // namespace dcr::relay_wire

namespace dcr::relay_detail {

DCR_NETWORK_INLINE std::string remote_text(const tcp::socket& s) {
  asio::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

DCR_NETWORK_INLINE std::string verify_failure(tls_stream& s) {
  const long r = SSL_get_verify_result(s.native_handle());
  if (r == X509_V_OK) return {};
  return X509_verify_cert_error_string(r);
}

DCR_NETWORK_INLINE std::string peer_common_name(tls_stream& s) {
  X509* cert = SSL_get1_peer_certificate(s.native_handle());
  if (cert == nullptr) return {};
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof buf - 1);
  X509_free(cert);
  return buf;
}

DCR_NETWORK_INLINE std::optional<relay_role> peer_certificate_role(tls_stream& s, std::string& problem) {
  std::unique_ptr<X509, decltype(&X509_free)> cert(SSL_get1_peer_certificate(s.native_handle()),
                                                   &X509_free);
  if (!cert) {
    problem = "is missing";
    return std::nullopt;
  }
  const X509_NAME* subject = X509_get_subject_name(cert.get());
  std::optional<relay_role> role;
  for (int at = X509_NAME_get_index_by_NID(subject, NID_organizationalUnitName, -1); at >= 0;
       at = X509_NAME_get_index_by_NID(subject, NID_organizationalUnitName, at)) {
    unsigned char* utf8 = nullptr;
    const int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at)));
    if (n < 0) continue;
    const std::string unit(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(n));
    OPENSSL_free(utf8);
    for (const auto r : {relay_role::owner, relay_role::root, relay_role::node}) {
      if (unit != relay_role_unit(r)) continue;
      if (role && *role != r) {
        problem = "grants several relay roles (" + relay_role_unit(*role) + ", " + unit +
                  "); a certificate grants one";
        return std::nullopt;
      }
      role = r;
    }
  }
  if (!role)
    problem = "grants no relay role (its subject has no OU=dcr-relay-owner, -root or -node)";
  return role;
}

DCR_NETWORK_INLINE void expect_server_name(tls_stream& s, const std::string& host) {
  SSL* ssl = s.native_handle();
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  asio::error_code ec;
  (void)asio::ip::make_address(host, ec);
  if (!ec) {
    DCR_EXPECTS(X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1, errc::invalid_argument,
                "relay TLS: cannot check server certificates against the address " + host);
    return;
  }
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  DCR_EXPECTS(SSL_set1_host(ssl, host.c_str()) == 1, errc::invalid_argument,
              "relay TLS: cannot check server certificates against the name " + host);
  SSL_set_tlsext_host_name(ssl, host.c_str());
}

DCR_NETWORK_INLINE asio::ssl::context make_context(const relay_tls& tls, bool server) {
  asio::ssl::context ctx(server ? asio::ssl::context::tls_server : asio::ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression);
  auto use = [&](const char* what, const std::filesystem::path& file, auto&& f) {
    asio::error_code ec;
    f(ec);
    DCR_EXPECTS(
        !ec, errc::invalid_argument,
        std::string("relay TLS: cannot use ") + what + " '" + file.string() + "': " + ec.message());
  };
  DCR_EXPECTS(!tls.ca_file.empty(), errc::invalid_argument,
              "relay TLS: no CA file (the deployment's CA certificate) given");
  use("CA file", tls.ca_file,
      [&](asio::error_code& ec) { ctx.load_verify_file(tls.ca_file.string(), ec); });
  if (!tls.cert_file.empty()) {
    use("certificate", tls.cert_file,
        [&](asio::error_code& ec) { ctx.use_certificate_chain_file(tls.cert_file.string(), ec); });
    use("private key", tls.key_file, [&](asio::error_code& ec) {
      ctx.use_private_key_file(tls.key_file.string(), asio::ssl::context::pem, ec);
    });
    DCR_EXPECTS(SSL_CTX_check_private_key(ctx.native_handle()) == 1, errc::invalid_argument,
                "relay TLS: private key '" + tls.key_file.string() +
                    "' does not match certificate '" + tls.cert_file.string() + "'");
  }
  ctx.set_verify_mode(server ? asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert
                             : asio::ssl::verify_peer);
  return ctx;
}

}  // namespace dcr::relay_detail

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
