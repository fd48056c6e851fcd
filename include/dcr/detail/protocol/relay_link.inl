// dcr/detail/protocol/relay_link.inl: the bodies of dcr/protocol/relay_link.hpp (included at its
// end).
#pragma once

namespace dcr::relay_wire {

inline writer::writer(relay_frame type, std::size_t reserve) {
  bytes_.reserve(header_bytes + reserve);
  bytes_.assign(header_bytes, std::byte{0});  // reserved fields zero (resize would leave them)
  bytes_[0] = static_cast<std::byte>(type);
}

inline writer& writer::str(std::string_view s) {
  DCR_EXPECTS(s.size() <= 0xffff, errc::overflow, "relay: string field longer than 65535 bytes");
  u16(static_cast<std::uint16_t>(s.size()));
  return raw(s.data(), s.size());
}

inline writer& writer::id(const payload_id& p) {
  return key(p.attempt).u32(p.owner).u32(p.sequence);
}

inline writer& writer::raw(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
  return *this;
}

inline frame_ptr writer::done() {
  const auto body = bytes_.size() - header_bytes;
  DCR_EXPECTS(body <= max_body_bytes, errc::overflow, "relay: frame body too large");
  const auto n = static_cast<std::uint32_t>(body);
  for (int i = 0; i < 4; ++i) bytes_[4 + i] = static_cast<std::byte>(n >> (8 * i));
  return std::make_shared<const buffer>(std::move(bytes_));
}

inline std::string reader::str() {
  const auto n = u16();
  const auto s = take(n);
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

inline attempt_key reader::key() {
  attempt_key k;
  k.base_version = u64();
  k.target_version = u64();
  k.number = u32();
  return k;
}

inline payload_id reader::id() {
  const auto k = key();
  payload_id p{k, 0, 0};
  p.owner = u32();
  p.sequence = u32();
  return p;
}

inline void reader::end() const {
  DCR_EXPECTS(at_ == body_.size(), errc::corrupt_payload,
              "relay: " + std::to_string(body_.size() - at_) +
                  " unexpected bytes after frame type " + std::to_string(static_cast<int>(type_)));
}

inline std::span<const std::byte> reader::take(std::size_t n) {
  DCR_EXPECTS(n <= body_.size() - at_, errc::corrupt_payload,
              "relay: frame type " + std::to_string(static_cast<int>(type_)) + " truncated");
  auto s = body_.subspan(at_, n);
  at_ += n;
  return s;
}

}  // namespace dcr::relay_wire

namespace dcr {

inline void relay_link::start(frame_handler on_frame, close_handler on_close) {
  on_frame_ = std::move(on_frame);
  on_close_ = std::move(on_close);
  read_header();
}

inline void relay_link::send(frame_ptr frame) {
  if (closed_) return;
  queued_bytes_ += frame->size();
  out_.push_back(std::move(frame));
  if (!writing_) write_some();
}

inline void relay_link::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  reason_ = reason;
  asio::error_code ec;
  stream_.lowest_layer().close(ec);
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

inline void relay_link::read_header() {
  asio::async_read(stream_, asio::buffer(header_),
                   [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
                     if (ec) return self->fail("reading from", ec);
                     self->read_body();
                   });
}

inline void relay_link::read_body() {
  const auto type = static_cast<relay_frame>(header_[0]);
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(header_[4 + i]) << (8 * i);
  if (header_[1] != 0 || header_[2] != 0 || header_[3] != 0)
    return close("malformed frame from " + peer_ + " (reserved header bits set)");
  if (n > relay_wire::max_body_bytes)
    return close("malformed frame from " + peer_ + " (body of " + std::to_string(n) + " bytes)");
  auto frame = std::make_shared<relay_wire::buffer>(relay_wire::header_bytes + n);
  std::memcpy(frame->data(), header_.data(), relay_wire::header_bytes);
  auto* body = frame->data() + relay_wire::header_bytes;
  asio::async_read(
      stream_, asio::buffer(body, n),
      [self = shared_from_this(), frame, type](const asio::error_code& ec, std::size_t) {
        if (ec) return self->fail("reading from", ec);
        if (self->closed_) return;
        try {
          if (self->on_frame_) self->on_frame_(type, frame);
        } catch (const std::exception& e) {
          return self->close("bad frame from " + self->peer_ + ": " + e.what());
        }
        if (!self->closed_) self->read_header();
      });
}

inline void relay_link::write_some() {
  if (out_.empty() || closed_) return;
  writing_ = true;
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
                      for (std::size_t i = 0; i < n; ++i) self->out_.pop_front();
                      self->queued_bytes_ -= bytes;
                      self->written_ += bytes;
                      self->write_some();
                    });
}

inline void relay_link::fail(const char* op, const asio::error_code& ec) {
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

inline void establishing::dial(const relay_endpoint& to, std::string what,
                               std::optional<relay_role> expect) {
  server_ = false;
  peer_ = to.text();
  what_ = std::move(what);
  expect_ = expect;
  arm();
  auto resolver = std::make_shared<tcp::resolver>(stream_.get_executor());
  resolver->async_resolve(
      to.host, std::to_string(to.port),
      [self = shared_from_this(), resolver](const asio::error_code& ec,
                                            tcp::resolver::results_type r) {
        if (ec)
          return self->finish(
              "cannot resolve " + self->what_ + " " + self->peer_ + ": " + ec.message(), true);
        asio::async_connect(
            self->socket(), r, [self](const asio::error_code& ec2, const tcp::endpoint&) {
              if (ec2)
                return self->finish(
                    "cannot connect to " + self->what_ + " " + self->peer_ + ": " + self->why(ec2),
                    true);
              asio::error_code ignored;
              self->socket().set_option(tcp::no_delay(true), ignored);
              self->stream_.async_handshake(
                  asio::ssl::stream_base::client, [self](const asio::error_code& ec3) {
                    if (ec3) {
                      const auto v = verify_failure(self->stream_);
                      return self->finish("TLS handshake with " + self->what_ + " " + self->peer_ +
                                          " failed: " + self->why(ec3) +
                                          (v.empty()
                                               ? ""
                                               : " (" + v +
                                                     ": its certificate is not signed by this "
                                                     "deployment's CA)"));
                    }
                    self->send_hello([self] { self->read_hello(); });
                  });
            });
      });
}

inline void establishing::accept(std::string where, std::vector<relay_role> accepted) {
  server_ = true;
  peer_ = remote_text(socket());
  what_ = std::move(where);
  accepted_ = std::move(accepted);
  asio::error_code ignored;
  socket().set_option(tcp::no_delay(true), ignored);
  arm();
  stream_.async_handshake(asio::ssl::stream_base::server,
                          [self = shared_from_this()](const asio::error_code& ec) {
                            if (ec) {
                              const auto v = verify_failure(self->stream_);
                              return self->finish(self->what_ + ": refused peer " + self->peer_ +
                                                  ": TLS handshake failed: " + self->why(ec) +
                                                  (v.empty() ? "" : " (" + v + ")"));
                            }
                            self->read_hello();
                          });
}

inline std::string establishing::why(const asio::error_code& ec) const {
  if (timed_out_) return "timed out after " + std::to_string(timeout_.count()) + " ms";
  return ec.message();
}

inline void establishing::arm() {
  timer_.expires_after(timeout_);
  timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (ec || self->finished_) return;
    self->timed_out_ = true;
    asio::error_code ignored;
    self->socket().close(ignored);
  });
}

inline std::string establishing::refused_text(const asio::error_code& ec) const {
  if (server_) return what_ + ": peer " + peer_ + " went away during the hello: " + why(ec);
  // TLS 1.3: the server's verdict on our certificate arrives as an alert on the first read.
  return what_ + " " + peer_ + " refused this peer after the TLS handshake: " + why(ec) +
         " (is this peer's certificate signed by the deployment's CA?)";
}

inline void establishing::read_hello() {
  asio::async_read(
      stream_, asio::buffer(header_),
      [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
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
              if (ec2) return self->finish(self->refused_text(ec2));
              relay_hello theirs;
              try {
                theirs = relay_wire::parse_hello(self->body_);
              } catch (const error& e) {
                return self->finish(self->what_ + (self->server_ ? ": refused peer " : " ") +
                                    self->peer_ + ": " + e.what());
              }
              if (self->server_) {
                if (std::find(self->accepted_.begin(), self->accepted_.end(), theirs.role) ==
                    self->accepted_.end())
                  return self->finish(self->what_ + ": refused peer " + self->peer_ +
                                      ": it says it is a " + relay_role_name(theirs.role) +
                                      ", which does not connect here");
                self->theirs_ = std::move(theirs);
                self->send_hello([self] { self->succeed(); });
              } else {
                if (self->expect_ && theirs.role != *self->expect_)
                  return self->finish(self->what_ + " " + self->peer_ + " is a " +
                                      relay_role_name(theirs.role) + ", not a " +
                                      relay_role_name(*self->expect_));
                self->theirs_ = std::move(theirs);
                self->succeed();
              }
            });
      });
}

inline void establishing::succeed() {
  if (finished_) return;
  finished_ = true;
  timer_.cancel();
  auto cn = peer_common_name(stream_);
  auto link = std::make_shared<relay_link>(std::move(stream_), peer_, theirs_, std::move(cn));
  done_(std::move(link), {}, false);
}

inline void establishing::finish(const std::string& err, bool unreachable) {
  if (finished_) return;
  finished_ = true;
  timer_.cancel();
  asio::error_code ignored;
  socket().close(ignored);
  done_(nullptr, err, unreachable);
}

inline listener::listener(asio::io_context& io, asio::ssl::context& ctx, const relay_endpoint& at,
                          std::string what, std::vector<relay_role> accepted, relay_hello mine,
                          std::chrono::milliseconds timeout, link_handler on_link,
                          refusal_handler on_refused)
    : io_(&io),
      ctx_(&ctx),
      acceptor_(io),
      accepted_(std::move(accepted)),
      mine_(std::move(mine)),
      timeout_(timeout),
      on_link_(std::move(on_link)),
      on_refused_(std::move(on_refused)) {
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

inline void listener::close() {
  asio::error_code ec;
  acceptor_.close(ec);
}

inline void listener::accept_next() {
  auto e = std::make_shared<establishing>(
      *io_, *ctx_, mine_, timeout_,
      [this](std::shared_ptr<relay_link> link, const std::string& err, bool) {
        if (link)
          on_link_(std::move(link));
        else
          on_refused_(err);
      });
  acceptor_.async_accept(e->socket(), [this, e](const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) e->accept(what_, accepted_);
    accept_next();
  });
}

inline void io_thread::stop(std::function<void()> last) {
  if (!thread_.joinable()) return;
  if (last) call([&] { last(); });
  work_.reset();
  io_.stop();
  thread_.join();
}

}  // namespace dcr::relay_detail

namespace dcr {

inline const char* relay_role_name(relay_role r) {
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

}  // namespace dcr

namespace dcr::relay_wire {

inline frame_ptr hello_frame(const relay_hello& h) {
  return writer(relay_frame::hello)
      .u32(magic)
      .u16(version)
      .u8(static_cast<std::uint8_t>(h.role))
      .u8(0)
      .u64(h.window)
      .str(h.name)
      .done();
}

inline relay_hello parse_hello(std::span<const std::byte> body) {
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

inline frame_ptr ack_frame(relay_subject what, const payload_id& id) {
  return writer(relay_frame::ack).u8(static_cast<std::uint8_t>(what)).id(id).done();
}

inline frame_ptr nack_frame(relay_subject what, const payload_id& id, std::string_view reason) {
  return writer(relay_frame::nack, 64 + reason.size())
      .u8(static_cast<std::uint8_t>(what))
      .id(id)
      .str(reason.substr(0, 4000))
      .done();
}

inline frame_ptr attempt_frame(const attempt_key& key, std::span<const std::string> receivers) {
  writer w(relay_frame::attempt);
  w.key(key).u32(static_cast<std::uint32_t>(receivers.size()));
  for (const auto& r : receivers) w.str(r);
  return w.done();
}

inline frame_ptr receivers_frame(std::span<const std::string> names) {
  writer w(relay_frame::receivers);
  w.u32(static_cast<std::uint32_t>(names.size()));
  for (const auto& n : names) w.str(n);
  return w.done();
}

inline frame_ptr manifest_frame(const attempt_key& key, std::uint32_t owner,
                                std::span<const payload_id> ids) {
  writer w(relay_frame::manifest, 24 + 4 * ids.size());
  w.key(key).u32(owner).u32(static_cast<std::uint32_t>(ids.size()));
  for (const auto& id : ids) w.u32(id.sequence);
  return w.done();
}

inline frame_ptr chunk_frame(const payload_id& id, std::uint64_t total, std::uint64_t offset,
                             std::span<const std::byte> data) {
  return writer(relay_frame::chunk, 48 + data.size())
      .id(id)
      .u64(total)
      .u64(offset)
      .raw(data.data(), data.size())
      .done();
}

inline chunk_view parse_chunk(std::span<const std::byte> body) {
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

inline std::string remote_text(const tcp::socket& s) {
  asio::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

inline std::string verify_failure(tls_stream& s) {
  const long r = SSL_get_verify_result(s.native_handle());
  if (r == X509_V_OK) return {};
  return X509_verify_cert_error_string(r);
}

inline std::string peer_common_name(tls_stream& s) {
  X509* cert = SSL_get1_peer_certificate(s.native_handle());
  if (cert == nullptr) return {};
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof buf - 1);
  X509_free(cert);
  return buf;
}

inline asio::ssl::context make_context(const relay_tls& tls, bool server) {
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
