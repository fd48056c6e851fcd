// dcr/protocol/relay_link.hpp: what every relay connection is made of (dcr/protocol/relay.hpp
// has the transport itself): mutual TLS over TCP (standalone Asio's ssl::stream over OpenSSL),
// the frame format, and the establishment of a connection with its refusals.
//
// Mutual TLS. Every peer (owner, root, node) has a certificate signed by the deployment's CA
// and trusts that CA only. A connection is usable only after the TLS handshake succeeded on
// both sides (the server demands a client certificate: verify_peer |
// verify_fail_if_no_peer_cert) and the two hellos were exchanged, so a peer without a
// certificate or with one from another CA is refused before a single frame of it is read.
// TLS 1.2 is the minimum; records are authenticated, so frames cannot be altered in transit.
// The server side reports every refusal, naming the peer's address and OpenSSL's reason; the
// client side throws (or reports) it naming the server's address. With TLS 1.3 a client learns
// that the server refused its certificate only on its first read, which is why the client
// waits for the server's hello before it calls a connection established.
//
// Frames (little-endian): an 8-byte header {u8 type, u8 0, u16 0, u32 body length} and the
// body. Strings are u16 length + bytes; an attempt key is {u64 base, u64 target, u32 attempt};
// a payload id is the key followed by {u32 owner, u32 sequence}.
//   hello      u32 magic "DCRL", u16 version 1, u8 role, u8 0, u64 window, string name
//   receivers  u32 n, n strings                  node -> root: the receivers attached there
//   attempt    key, u32 n, n strings             owner -> root -> node: an attempt and the
//                                                receivers it requires
//   ready      key                               root -> owner: every required receiver is
//                                                reachable; stream the attempt
//   chunk      id, u64 total, u64 offset, bytes  part of a payload (cut-through)
//   abort      id                                root -> node: drop a partial payload (its
//                                                owner went away)
//   manifest   key, u32 owner, u32 n, n x u32    the owner's complete list (sequences)
//   credit     u64 bytes                         the receiver of a data stream frees bytes
//   ack        u8 what, id                       delivered (what 0 payload, 1 manifest)
//   nack       u8 what, id, string reason        not delivered (what 2: the attempt itself)
// Reserved fields must be zero; a malformed frame closes the connection with the reason.
#pragma once

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <array>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// A TCP endpoint: a host (name or address) and a port.
struct relay_endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  [[nodiscard]] std::string text() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const relay_endpoint&, const relay_endpoint&) = default;
};

/// The files of one peer's TLS identity (PEM). scripts/make-test-certs.sh writes a throwaway
/// set. Every relay peer presents cert_file and trusts only ca_file.
struct relay_tls {
  std::filesystem::path ca_file;    ///< the deployment's CA certificate: the only trust anchor
  std::filesystem::path cert_file;  ///< this peer's certificate (chain), signed by that CA;
                                    ///< empty: present none (every relay server refuses that)
  std::filesystem::path key_file;   ///< its private key

  /// DIR/ca.pem, DIR/NAME.pem and DIR/NAME.key (the layout of scripts/make-test-certs.sh).
  static relay_tls in_directory(const std::filesystem::path& dir, const std::string& name) {
    return {dir / "ca.pem", dir / (name + ".pem"), dir / (name + ".key")};
  }
};

/// Who a peer says it is in its hello.
enum class relay_role : std::uint8_t { owner = 1, root = 2, node = 3 };

inline const char* relay_role_name(relay_role r) {
  switch (r) {
    case relay_role::owner: return "owner";
    case relay_role::root: return "root";
    case relay_role::node: return "node";
  }
  return "unknown peer";
}

enum class relay_frame : std::uint8_t {
  hello = 1,
  receivers = 2,
  attempt = 3,
  ready = 4,
  chunk = 5,
  abort = 6,
  manifest = 7,
  credit = 8,
  ack = 9,
  nack = 10,
};

/// What an ack or nack is about.
enum class relay_subject : std::uint8_t { payload = 0, manifest = 1, attempt = 2 };

struct relay_hello {
  relay_role role = relay_role::owner;
  std::uint64_t window = 0;  ///< bytes the sender of this hello lets the other side send it
  std::string name;          ///< for messages ("owner 3", "root 1 127.0.0.1:5001")
};

namespace relay_wire {

constexpr std::uint32_t magic = 0x4c524344;  // "DCRL"
constexpr std::uint16_t version = 1;
constexpr std::size_t header_bytes = 8;
/// The largest frame body accepted (a chunk of at most 16 MiB and its header).
constexpr std::size_t max_body_bytes = (std::size_t{16} << 20) + 256;
/// Bytes of a chunk frame besides its data.
constexpr std::size_t chunk_overhead = header_bytes + 28 + 16;

/// An allocator that leaves bytes uninitialized (a std::vector of std::byte would clear every
/// chunk and payload buffer before it is overwritten: a page-touching memset per frame).
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() noexcept = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}  // NOLINT
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
/// Frame and payload bytes.
using buffer = std::vector<std::byte, uninitialized_allocator<std::byte>>;
using frame_ptr = std::shared_ptr<const buffer>;

/// Builds one frame: header, then fields appended in order.
class writer {
 public:
  explicit writer(relay_frame type, std::size_t reserve = 64) {
    bytes_.reserve(header_bytes + reserve);
    bytes_.assign(header_bytes, std::byte{0});  // reserved fields zero (resize would leave them)
    bytes_[0] = static_cast<std::byte>(type);
  }
  writer& u8(std::uint8_t v) { return raw(&v, 1); }
  writer& u16(std::uint16_t v) { return le(v); }
  writer& u32(std::uint32_t v) { return le(v); }
  writer& u64(std::uint64_t v) { return le(v); }
  writer& str(std::string_view s) {
    DCR_EXPECTS(s.size() <= 0xffff, errc::overflow, "relay: string field longer than 65535 bytes");
    u16(static_cast<std::uint16_t>(s.size()));
    return raw(s.data(), s.size());
  }
  writer& key(const attempt_key& k) { return u64(k.base_version).u64(k.target_version).u32(k.number); }
  writer& id(const payload_id& p) {
    return key(p.attempt).u32(p.owner).u32(p.sequence);
  }
  writer& raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  /// The finished frame (the header's length filled in).
  frame_ptr done() {
    const auto body = bytes_.size() - header_bytes;
    DCR_EXPECTS(body <= max_body_bytes, errc::overflow, "relay: frame body too large");
    const auto n = static_cast<std::uint32_t>(body);
    for (int i = 0; i < 4; ++i) bytes_[4 + i] = static_cast<std::byte>(n >> (8 * i));
    return std::make_shared<const buffer>(std::move(bytes_));
  }

 private:
  template <class T>
  writer& le(T v) {
    std::byte b[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
    return raw(b, sizeof(T));
  }
  buffer bytes_;
};

/// Reads the fields of one frame body; every read is bounds-checked and throws
/// errc::corrupt_payload naming the frame type.
class reader {
 public:
  reader(std::span<const std::byte> body, relay_frame type) : body_(body), type_(type) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::uint16_t u16() { return le<std::uint16_t>(); }
  std::uint32_t u32() { return le<std::uint32_t>(); }
  std::uint64_t u64() { return le<std::uint64_t>(); }
  std::string str() {
    const auto n = u16();
    const auto s = take(n);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }
  attempt_key key() {
    attempt_key k;
    k.base_version = u64();
    k.target_version = u64();
    k.number = u32();
    return k;
  }
  payload_id id() {
    const auto k = key();
    payload_id p{k, 0, 0};
    p.owner = u32();
    p.sequence = u32();
    return p;
  }
  std::span<const std::byte> rest() { return take(body_.size() - at_); }
  /// The body must be fully read.
  void end() const {
    DCR_EXPECTS(at_ == body_.size(), errc::corrupt_payload,
                "relay: " + std::to_string(body_.size() - at_) + " unexpected bytes after frame type " +
                    std::to_string(static_cast<int>(type_)));
  }

 private:
  std::span<const std::byte> take(std::size_t n) {
    DCR_EXPECTS(n <= body_.size() - at_, errc::corrupt_payload,
                "relay: frame type " + std::to_string(static_cast<int>(type_)) + " truncated");
    auto s = body_.subspan(at_, n);
    at_ += n;
    return s;
  }
  template <class T>
  T le() {
    const auto s = take(sizeof(T));
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<std::uint8_t>(s[i])) << (8 * i);
    return v;
  }
  std::span<const std::byte> body_;
  relay_frame type_;
  std::size_t at_ = 0;
};

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
  DCR_EXPECTS(r.u32() == magic, errc::corrupt_payload, "relay: not a dcr relay peer (bad hello magic)");
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

inline frame_ptr credit_frame(std::uint64_t bytes) { return writer(relay_frame::credit).u64(bytes).done(); }

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

/// A chunk frame: the header of a chunk and its data.
inline frame_ptr chunk_frame(const payload_id& id, std::uint64_t total, std::uint64_t offset,
                             std::span<const std::byte> data) {
  return writer(relay_frame::chunk, 48 + data.size()).id(id).u64(total).u64(offset).raw(data.data(), data.size()).done();
}

/// A parsed chunk frame (data points into the frame).
struct chunk_view {
  payload_id id;
  std::uint64_t total = 0, offset = 0;
  std::span<const std::byte> data;
};

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

/// Whether attempt `a` comes after attempt `b`. Attempts of one transition (base version v)
/// are numbered together, restores (v -> v) and refits (v -> v+1) alike, so the order is by base
/// version, then attempt number (a restore of v numbered after a failed refit of v -> v+1 is
/// the later one, though its key compares lower).
constexpr bool later_attempt(const attempt_key& a, const attempt_key& b) noexcept {
  if (a.base_version != b.base_version) return a.base_version > b.base_version;
  if (a.number != b.number) return a.number > b.number;
  return a.target_version > b.target_version;
}

inline std::string describe(const payload_id& id) { return "payload " + to_string(id); }
inline std::string describe(const attempt_key& k) { return "attempt " + to_string(k); }

}  // namespace relay_wire

namespace relay_detail {

using tcp = asio::ip::tcp;
using tls_stream = asio::ssl::stream<tcp::socket>;

/// "ADDRESS:PORT" of a connected socket's far end ("unknown peer" if it is gone).
inline std::string remote_text(const tcp::socket& s) {
  asio::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

/// OpenSSL's certificate verification result, when it failed ("" otherwise).
inline std::string verify_failure(tls_stream& s) {
  const long r = SSL_get_verify_result(s.native_handle());
  if (r == X509_V_OK) return {};
  return X509_verify_cert_error_string(r);
}

/// The common name of the peer's certificate ("" without one).
inline std::string peer_common_name(tls_stream& s) {
  X509* cert = SSL_get1_peer_certificate(s.native_handle());
  if (cert == nullptr) return {};
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof buf - 1);
  X509_free(cert);
  return buf;
}

/// A TLS context for one side of relay connections: the CA as the only trust anchor, this
/// peer's certificate and key, TLS >= 1.2, peer verification (servers demand a certificate).
/// Throws errc::invalid_argument naming the file that cannot be used.
inline asio::ssl::context make_context(const relay_tls& tls, bool server) {
  asio::ssl::context ctx(server ? asio::ssl::context::tls_server : asio::ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression);
  auto use = [&](const char* what, const std::filesystem::path& file, auto&& f) {
    asio::error_code ec;
    f(ec);
    DCR_EXPECTS(!ec, errc::invalid_argument,
                std::string("relay TLS: cannot use ") + what + " '" + file.string() + "': " + ec.message());
  };
  DCR_EXPECTS(!tls.ca_file.empty(), errc::invalid_argument,
              "relay TLS: no CA file (the deployment's CA certificate) given");
  use("CA file", tls.ca_file, [&](asio::error_code& ec) { ctx.load_verify_file(tls.ca_file.string(), ec); });
  if (!tls.cert_file.empty()) {
    use("certificate", tls.cert_file,
        [&](asio::error_code& ec) { ctx.use_certificate_chain_file(tls.cert_file.string(), ec); });
    use("private key", tls.key_file, [&](asio::error_code& ec) {
      ctx.use_private_key_file(tls.key_file.string(), asio::ssl::context::pem, ec);
    });
    DCR_EXPECTS(SSL_CTX_check_private_key(ctx.native_handle()) == 1, errc::invalid_argument,
                "relay TLS: private key '" + tls.key_file.string() + "' does not match certificate '" +
                    tls.cert_file.string() + "'");
  }
  ctx.set_verify_mode(server ? asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert
                             : asio::ssl::verify_peer);
  return ctx;
}

}  // namespace relay_detail

/// One established relay connection (TLS handshake and hellos done): frames in, frames out.
/// Used on its io_context's thread only (post to it from elsewhere). Frames are written in
/// order from a queue; reads deliver each whole frame (header included, so a chunk can be
/// forwarded as it came). A read or write error, a malformed frame or close() ends it: the
/// on_close handler runs once, posted, with the reason.
class relay_link : public std::enable_shared_from_this<relay_link> {
 public:
  using frame_ptr = relay_wire::frame_ptr;
  /// type, the whole frame (header + body); the body starts at header_bytes.
  using frame_handler = std::function<void(relay_frame, const frame_ptr&)>;
  using close_handler = std::function<void(const std::string& reason)>;

  relay_link(relay_detail::tls_stream stream, std::string peer, relay_hello hello, std::string peer_cn)
      : stream_(std::move(stream)), peer_(std::move(peer)), hello_(std::move(hello)),
        peer_cn_(std::move(peer_cn)) {}

  /// Starts reading; handlers run on the io thread.
  void start(frame_handler on_frame, close_handler on_close) {
    on_frame_ = std::move(on_frame);
    on_close_ = std::move(on_close);
    read_header();
  }

  /// Queues a frame (io thread only). Ignored once closed.
  void send(frame_ptr frame) {
    if (closed_) return;
    queued_bytes_ += frame->size();
    out_.push_back(std::move(frame));
    if (!writing_) write_some();
  }

  /// Ends the connection (io thread only): the socket is closed at once; on_close runs once.
  void close(const std::string& reason) {
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

  [[nodiscard]] bool closed() const noexcept { return closed_; }
  /// The far end's address ("127.0.0.1:5001").
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  /// The far end's hello (role, window, name).
  [[nodiscard]] const relay_hello& hello() const noexcept { return hello_; }
  /// The common name of the far end's certificate.
  [[nodiscard]] const std::string& peer_cn() const noexcept { return peer_cn_; }
  /// Bytes queued and not yet written.
  [[nodiscard]] std::uint64_t queued_bytes() const noexcept { return queued_bytes_; }
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

 private:
  void read_header() {
    asio::async_read(stream_, asio::buffer(header_),
                     [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
                       if (ec) return self->fail("reading from", ec);
                       self->read_body();
                     });
  }
  void read_body() {
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
    asio::async_read(stream_, asio::buffer(body, n),
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
  void write_some() {
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
  void fail(const char* op, const asio::error_code& ec) {
    if (closed_) return;
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated || ec == asio::error::connection_reset)
      close("connection closed by " + peer_ + (ec == asio::error::connection_reset ? " (reset)" : ""));
    else
      close(std::string(op) + " " + peer_ + " failed: " + ec.message());
  }

  relay_detail::tls_stream stream_;
  std::string peer_;
  relay_hello hello_;
  std::string peer_cn_;
  frame_handler on_frame_;
  close_handler on_close_;
  std::array<std::uint8_t, relay_wire::header_bytes> header_{};
  std::deque<frame_ptr> out_;
  std::vector<asio::const_buffer> batch_;
  bool writing_ = false, closed_ = false;
  std::uint64_t queued_bytes_ = 0, written_ = 0;
  std::string reason_;
};

namespace relay_detail {

/// One connection being established (either side): TLS handshake, then the hello exchange,
/// all under one timer. `done(link, error, unreachable)` runs once on the io thread: a link (not
/// started), or an error message naming the peer and whether the peer could not be reached at
/// all (no TCP connection: worth retrying) as opposed to refused or failed after connecting.
class establishing : public std::enable_shared_from_this<establishing> {
 public:
  using done_handler =
      std::function<void(std::shared_ptr<relay_link>, const std::string& error, bool unreachable)>;

  establishing(asio::io_context& io, asio::ssl::context& ctx, relay_hello mine,
               std::chrono::milliseconds timeout, done_handler done)
      : stream_(io, ctx), timer_(io), mine_(std::move(mine)), timeout_(timeout), done_(std::move(done)) {}

  tcp::socket& socket() { return stream_.next_layer(); }

  /// Client side: connect to `to` (a `what`, e.g. "root"), handshake, send the hello, read the
  /// server's.
  void dial(const relay_endpoint& to, std::string what, std::optional<relay_role> expect) {
    server_ = false;
    peer_ = to.text();
    what_ = std::move(what);
    expect_ = expect;
    arm();
    auto resolver = std::make_shared<tcp::resolver>(stream_.get_executor());
    resolver->async_resolve(
        to.host, std::to_string(to.port),
        [self = shared_from_this(), resolver](const asio::error_code& ec, tcp::resolver::results_type r) {
          if (ec) return self->finish("cannot resolve " + self->what_ + " " + self->peer_ + ": " + ec.message(), true);
          asio::async_connect(self->socket(), r, [self](const asio::error_code& ec2, const tcp::endpoint&) {
            if (ec2) return self->finish("cannot connect to " + self->what_ + " " + self->peer_ + ": " + self->why(ec2), true);
            asio::error_code ignored;
            self->socket().set_option(tcp::no_delay(true), ignored);
            self->stream_.async_handshake(asio::ssl::stream_base::client, [self](const asio::error_code& ec3) {
              if (ec3) {
                const auto v = verify_failure(self->stream_);
                return self->finish("TLS handshake with " + self->what_ + " " + self->peer_ + " failed: " +
                                    self->why(ec3) +
                                    (v.empty() ? "" : " (" + v + ": its certificate is not signed by this "
                                                      "deployment's CA)"));
              }
              self->send_hello([self] { self->read_hello(); });
            });
          });
        });
  }

  /// Server side, on an accepted socket: handshake, read the client's hello, check its role,
  /// answer with ours. `where` names the server ("relay root 127.0.0.1:5001").
  void accept(std::string where, std::vector<relay_role> accepted) {
    server_ = true;
    peer_ = remote_text(socket());
    what_ = std::move(where);
    accepted_ = std::move(accepted);
    asio::error_code ignored;
    socket().set_option(tcp::no_delay(true), ignored);
    arm();
    stream_.async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](const asio::error_code& ec) {
      if (ec) {
        const auto v = verify_failure(self->stream_);
        return self->finish(self->what_ + ": refused peer " + self->peer_ + ": TLS handshake failed: " +
                            self->why(ec) + (v.empty() ? "" : " (" + v + ")"));
      }
      self->read_hello();
    });
  }

 private:
  std::string why(const asio::error_code& ec) const {
    if (timed_out_) return "timed out after " + std::to_string(timeout_.count()) + " ms";
    return ec.message();
  }
  void arm() {
    timer_.expires_after(timeout_);
    timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
      if (ec || self->finished_) return;
      self->timed_out_ = true;
      asio::error_code ignored;
      self->socket().close(ignored);
    });
  }
  template <class Next>
  void send_hello(Next next) {
    hello_out_ = relay_wire::hello_frame(mine_);
    asio::async_write(stream_, asio::buffer(*hello_out_), [self = shared_from_this(), next](const asio::error_code& ec, std::size_t) {
      if (ec) return self->finish(self->refused_text(ec));
      next();
    });
  }
  std::string refused_text(const asio::error_code& ec) const {
    if (server_) return what_ + ": peer " + peer_ + " went away during the hello: " + why(ec);
    // TLS 1.3: the server's verdict on our certificate arrives as an alert on the first read.
    return what_ + " " + peer_ + " refused this peer after the TLS handshake: " + why(ec) +
           " (is this peer's certificate signed by the deployment's CA?)";
  }
  void read_hello() {
    asio::async_read(stream_, asio::buffer(header_), [self = shared_from_this()](const asio::error_code& ec, std::size_t) {
      if (ec) return self->finish(self->refused_text(ec));
      std::uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(self->header_[4 + i]) << (8 * i);
      if (static_cast<relay_frame>(self->header_[0]) != relay_frame::hello || n > 4096)
        return self->finish(self->what_ + (self->server_ ? ": refused peer " : " ") + self->peer_ +
                            ": the first frame is not a relay hello");
      self->body_.resize(n);
      asio::async_read(self->stream_, asio::buffer(self->body_), [self](const asio::error_code& ec2, std::size_t) {
        if (ec2) return self->finish(self->refused_text(ec2));
        relay_hello theirs;
        try {
          theirs = relay_wire::parse_hello(self->body_);
        } catch (const error& e) {
          return self->finish(self->what_ + (self->server_ ? ": refused peer " : " ") + self->peer_ + ": " + e.what());
        }
        if (self->server_) {
          if (std::find(self->accepted_.begin(), self->accepted_.end(), theirs.role) == self->accepted_.end())
            return self->finish(self->what_ + ": refused peer " + self->peer_ + ": it says it is a " +
                                relay_role_name(theirs.role) + ", which does not connect here");
          self->theirs_ = std::move(theirs);
          self->send_hello([self] { self->succeed(); });
        } else {
          if (self->expect_ && theirs.role != *self->expect_)
            return self->finish(self->what_ + " " + self->peer_ + " is a " + relay_role_name(theirs.role) +
                                ", not a " + relay_role_name(*self->expect_));
          self->theirs_ = std::move(theirs);
          self->succeed();
        }
      });
    });
  }
  void succeed() {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    auto cn = peer_common_name(stream_);
    auto link = std::make_shared<relay_link>(std::move(stream_), peer_, theirs_, std::move(cn));
    done_(std::move(link), {}, false);
  }
  void finish(const std::string& err, bool unreachable = false) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    asio::error_code ignored;
    socket().close(ignored);
    done_(nullptr, err, unreachable);
  }

  tls_stream stream_;
  asio::steady_timer timer_;
  relay_hello mine_, theirs_;
  std::chrono::milliseconds timeout_;
  done_handler done_;
  bool server_ = false, finished_ = false, timed_out_ = false;
  std::string peer_, what_;
  std::optional<relay_role> expect_;
  std::vector<relay_role> accepted_;
  std::array<std::uint8_t, relay_wire::header_bytes> header_{};
  std::vector<std::byte> body_;
  relay_wire::frame_ptr hello_out_;
};

/// Accepts relay connections on an endpoint: each one is established (TLS + hello, under
/// `timeout`) and handed to on_link, or refused and reported to on_refused. Io thread only.
class listener {
 public:
  using link_handler = std::function<void(std::shared_ptr<relay_link>)>;
  using refusal_handler = std::function<void(const std::string&)>;

  listener(asio::io_context& io, asio::ssl::context& ctx, const relay_endpoint& at, std::string what,
           std::vector<relay_role> accepted, relay_hello mine, std::chrono::milliseconds timeout,
           link_handler on_link, refusal_handler on_refused)
      : io_(&io), ctx_(&ctx), acceptor_(io), accepted_(std::move(accepted)), mine_(std::move(mine)),
        timeout_(timeout), on_link_(std::move(on_link)), on_refused_(std::move(on_refused)) {
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
    DCR_EXPECTS(!ec, errc::transport_failure, what + ": cannot listen on " + at.text() + ": " + ec.message());
    bound_ = relay_endpoint{ep.address().to_string(), acceptor_.local_endpoint().port()};
    what_ = what + " " + bound_.text();
  }

  void start() { accept_next(); }
  void close() {
    asio::error_code ec;
    acceptor_.close(ec);
  }
  /// Where it listens (the actual port when asked for port 0).
  [[nodiscard]] const relay_endpoint& endpoint() const noexcept { return bound_; }
  [[nodiscard]] const std::string& what() const noexcept { return what_; }

 private:
  void accept_next() {
    auto e = std::make_shared<establishing>(*io_, *ctx_, mine_, timeout_,
                                            [this](std::shared_ptr<relay_link> link, const std::string& err, bool) {
                                              if (link) on_link_(std::move(link));
                                              else on_refused_(err);
                                            });
    acceptor_.async_accept(e->socket(), [this, e](const asio::error_code& ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) e->accept(what_, accepted_);
      accept_next();
    });
  }

  asio::io_context* io_;
  asio::ssl::context* ctx_;
  tcp::acceptor acceptor_;
  std::vector<relay_role> accepted_;
  relay_hello mine_;
  std::chrono::milliseconds timeout_;
  link_handler on_link_;
  refusal_handler on_refused_;
  relay_endpoint bound_;
  std::string what_;
};

/// An io_context with its own thread, for one relay component; stop() (or the destructor) ends
/// it after running `last` on it.
class io_thread {
 public:
  io_thread() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  io_thread(const io_thread&) = delete;
  io_thread& operator=(const io_thread&) = delete;
  ~io_thread() { stop({}); }

  asio::io_context& io() noexcept { return io_; }

  /// Runs `f` on the io thread and waits for it (not from the io thread).
  template <class F>
  auto call(F&& f) -> decltype(f()) {
    using R = decltype(f());
    std::packaged_task<R()> task(std::forward<F>(f));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }

  /// Runs `last` on the io thread, then stops it and joins (idempotent).
  void stop(std::function<void()> last) {
    if (!thread_.joinable()) return;
    if (last) call([&] { last(); });
    work_.reset();
    io_.stop();
    thread_.join();
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace relay_detail
}  // namespace dcr
