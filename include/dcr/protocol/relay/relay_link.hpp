// dcr/protocol/relay/relay_link.hpp: what every relay connection is made of (dcr/protocol/relay/relay.hpp
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
// Roles are bound to certificates. A certificate grants exactly one relay role, in its subject's
// organizational unit: OU=dcr-relay-owner, OU=dcr-relay-root or OU=dcr-relay-node
// (scripts/make-test-certs.sh issues them; read with OpenSSL's X509_NAME accessors). Both ends
// check it: a server refuses a client whose certificate grants no role, a role that does not
// connect there, or another role than its hello claims; a client refuses a server whose
// certificate is not of the role it dials (an owner dials roots, a root dials nodes) and, before
// that, whose certificate is not issued for the address it dialed (OpenSSL's host or IP check,
// X509_VERIFY_PARAM: the subject alternative names must hold the dialed IP address or DNS name).
// Each refusal names the peer, the role it claims and its certificate's subject name.
//
// Liveness. Each side of an established connection sends a heartbeat frame when it has written
// nothing for relay_heartbeat::interval, and closes the connection ("no frame from ... for N
// ms") when it has read nothing for relay_heartbeat::timeout, so a frozen or vanished peer is
// found within the timeout, not at an attempt's deadline.
//
// Admission. A listener holds at most relay_accept_limits::pending handshakes (and
// per_address from one source address); beyond that the oldest pending handshake (of that
// address, or of all) is dropped, so silent connections cannot hold descriptors without bound
// nor keep a legitimate peer out. Accept errors (EMFILE and the like) back off, 10 ms doubling
// to 1 s, instead of re-arming at once.
//
// Frames (little-endian): an 8-byte header {u8 type, u8 0, u16 0, u32 body length} and the
// body. Strings are u16 length + bytes; an attempt key is {u64 base, u64 target, u32 attempt};
// a payload id is the key followed by {u32 owner, u32 sequence}.
//   hello      u32 magic "DCRL", u16 version 2, u8 role, u8 0, u64 window, string name
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
//   heartbeat  (empty)                           either way: this side is alive
// Reserved fields must be zero; a malformed frame closes the connection with the reason. Every
// count (n above) is checked against the bytes left in its frame and against a hard limit
// (relay_wire::max_receivers, max_manifest_payloads) before anything is sized by it.
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
#include <map>
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
#include "dcr/config.hpp"
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

/// Who a peer is: the role its certificate grants (OU=dcr-relay-ROLE) and its hello states.
enum class relay_role : std::uint8_t { owner = 1, root = 2, node = 3 };

const char* relay_role_name(relay_role r);

/// The organizational unit that grants role `r` in a certificate's subject ("dcr-relay-root").
std::string relay_role_unit(relay_role r);

/// How an established connection finds a frozen or vanished peer (see the file comment).
struct relay_heartbeat {
  std::chrono::milliseconds interval{1000};  ///< send a heartbeat after this long without writing
  std::chrono::milliseconds timeout{5000};   ///< close after this long without reading a frame
};

/// How many TLS handshakes a listener lets wait at once (see the file comment).
struct relay_accept_limits {
  std::size_t pending = 64;      ///< pending handshakes per listener
  std::size_t per_address = 8;   ///< pending handshakes per source address
};

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
  heartbeat = 11,
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
constexpr std::uint16_t version = 2;  // 2: heartbeats, roles bound to certificates
constexpr std::size_t header_bytes = 8;
/// The largest frame body accepted (a chunk of at most 16 MiB and its header).
constexpr std::size_t max_body_bytes = (std::size_t{16} << 20) + 256;
/// The most receivers an attempt frame (or a node's receivers frame) may name.
constexpr std::uint32_t max_receivers = 65536;
/// The most payloads one owner's manifest may list.
constexpr std::uint32_t max_manifest_payloads = std::uint32_t{1} << 20;
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
  explicit writer(relay_frame type, std::size_t reserve = 64);
  writer& u8(std::uint8_t v) { return raw(&v, 1); }
  writer& u16(std::uint16_t v) { return le(v); }
  writer& u32(std::uint32_t v) { return le(v); }
  writer& u64(std::uint64_t v) { return le(v); }
  writer& str(std::string_view s);
  writer& key(const attempt_key& k) { return u64(k.base_version).u64(k.target_version).u32(k.number); }
  writer& id(const payload_id& p);
  writer& raw(const void* p, std::size_t n);
  /// The finished frame (the header's length filled in).
  frame_ptr done();

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
  std::string str();
  attempt_key key();
  payload_id id();
  /// A u32 count of items of at least item_bytes each that follow in this frame: throws
  /// errc::corrupt_payload naming the frame and `what` unless they fit in the bytes left and the
  /// count is at most `limit`, so nothing is ever sized by an unchecked count.
  std::uint32_t count(std::size_t item_bytes, std::uint32_t limit, const char* what);
  std::span<const std::byte> rest() { return take(body_.size() - at_); }
  /// The body must be fully read.
  void end() const;

 private:
  std::span<const std::byte> take(std::size_t n);
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

frame_ptr hello_frame(const relay_hello& h);

relay_hello parse_hello(std::span<const std::byte> body);

inline frame_ptr credit_frame(std::uint64_t bytes) { return writer(relay_frame::credit).u64(bytes).done(); }

frame_ptr ack_frame(relay_subject what, const payload_id& id);

frame_ptr nack_frame(relay_subject what, const payload_id& id, std::string_view reason);

frame_ptr attempt_frame(const attempt_key& key, std::span<const std::string> receivers);

frame_ptr receivers_frame(std::span<const std::string> names);

frame_ptr manifest_frame(const attempt_key& key, std::uint32_t owner,
                                std::span<const payload_id> ids);

/// A chunk frame: the header of a chunk and its data.
frame_ptr chunk_frame(const payload_id& id, std::uint64_t total, std::uint64_t offset,
                             std::span<const std::byte> data);

/// A parsed chunk frame (data points into the frame).
struct chunk_view {
  payload_id id;
  std::uint64_t total = 0, offset = 0;
  std::span<const std::byte> data;
};

chunk_view parse_chunk(std::span<const std::byte> body);

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
std::string remote_text(const tcp::socket& s);

/// OpenSSL's certificate verification result, when it failed ("" otherwise).
std::string verify_failure(tls_stream& s);

/// The common name of the peer's certificate ("" without one).
std::string peer_common_name(tls_stream& s);

/// The relay role the peer's certificate grants, or nullopt with `problem` saying why none: no
/// certificate, no OU=dcr-relay-ROLE in its subject, or several roles.
std::optional<relay_role> peer_certificate_role(tls_stream& s, std::string& problem);

/// Makes the client side of `s` verify that the server's certificate is issued for `host` (an
/// IP address or a DNS name, matched against its subject alternative names by OpenSSL), and
/// sends `host` as the TLS server name when it is a name.
void expect_server_name(tls_stream& s, const std::string& host);

/// A TLS context for one side of relay connections: the CA as the only trust anchor, this
/// peer's certificate and key, TLS >= 1.2, peer verification (servers demand a certificate).
/// Throws errc::invalid_argument naming the file that cannot be used.
asio::ssl::context make_context(const relay_tls& tls, bool server);

}  // namespace relay_detail

/// One established relay connection (TLS handshake and hellos done): frames in, frames out.
/// Used on its io_context's thread only (post to it from elsewhere). Frames are written in
/// order from a queue; reads deliver each whole frame (header included, so a chunk can be
/// forwarded as it came). A read or write error, a malformed frame, a heartbeat timeout or
/// close() ends it: the on_close handler runs once, posted, with the reason. Heartbeat frames
/// are sent and consumed here; on_frame never sees them.
class relay_link : public std::enable_shared_from_this<relay_link> {
 public:
  using frame_ptr = relay_wire::frame_ptr;
  /// type, the whole frame (header + body); the body starts at header_bytes.
  using frame_handler = std::function<void(relay_frame, const frame_ptr&)>;
  using close_handler = std::function<void(const std::string& reason)>;

  relay_link(relay_detail::tls_stream stream, std::string peer, relay_hello hello, std::string peer_cn,
             relay_heartbeat heartbeat = {})
      : stream_(std::move(stream)), beat_(stream_.get_executor()), peer_(std::move(peer)),
        hello_(std::move(hello)), peer_cn_(std::move(peer_cn)), heartbeat_(heartbeat) {}

  /// Starts reading and the heartbeat; handlers run on the io thread.
  void start(frame_handler on_frame, close_handler on_close);

  /// Queues a frame (io thread only). Ignored once closed.
  void send(frame_ptr frame);

  /// Ends the connection (io thread only): the socket is closed at once; on_close runs once.
  void close(const std::string& reason);

  [[nodiscard]] bool closed() const noexcept { return closed_; }
  /// The far end's address ("127.0.0.1:5001").
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  /// The far end's hello (role, window, name); its role is the one its certificate grants.
  [[nodiscard]] const relay_hello& hello() const noexcept { return hello_; }
  /// The common name of the far end's certificate.
  [[nodiscard]] const std::string& peer_cn() const noexcept { return peer_cn_; }
  /// Bytes queued and not yet written.
  [[nodiscard]] std::uint64_t queued_bytes() const noexcept { return queued_bytes_; }
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

 private:
  void read_header();
  void read_body();
  void write_some();
  void beat();
  void fail(const char* op, const asio::error_code& ec);

  relay_detail::tls_stream stream_;
  asio::steady_timer beat_;
  std::string peer_;
  relay_hello hello_;
  std::string peer_cn_;
  relay_heartbeat heartbeat_;
  std::chrono::steady_clock::time_point last_read_{}, last_write_{};
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
/// all under one timer that ends it by itself (a resolver or handshake that never answers
/// included). `done(link, error, unreachable)` runs once on the io thread: a link (not started),
/// or an error message naming the peer and whether the peer could not be reached at all (no TCP
/// connection, or closed before the TLS handshake completed without a TLS alert: worth
/// retrying) as opposed to refused or failed after connecting.
class establishing : public std::enable_shared_from_this<establishing> {
 public:
  using done_handler =
      std::function<void(std::shared_ptr<relay_link>, const std::string& error, bool unreachable)>;

  establishing(asio::io_context& io, asio::ssl::context& ctx, relay_hello mine,
               std::chrono::milliseconds timeout, done_handler done, relay_heartbeat heartbeat = {})
      : stream_(io, ctx), timer_(io), mine_(std::move(mine)), timeout_(timeout),
        heartbeat_(heartbeat), done_(std::move(done)) {}

  tcp::socket& socket() { return stream_.next_layer(); }

  /// Client side: connect to `to` (a `what`, e.g. "root"), check that the server's certificate
  /// is issued for to.host and grants role `expect` (or, without one, the role its hello
  /// claims), send the hello, read the server's.
  void dial(const relay_endpoint& to, std::string what, std::optional<relay_role> expect);

  /// Server side, on an accepted socket: handshake, read the client's hello, refuse it unless
  /// its certificate grants the role the hello claims and that role is among `accepted`, answer
  /// with ours. `where` names the server ("relay root 127.0.0.1:5001").
  void accept(std::string where, std::vector<relay_role> accepted);

  /// Ends it now with `why` (io thread; nothing if it is done already).
  void abandon(const std::string& why);

  /// The far end's address ("" before dial or accept).
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }

 private:
  enum class stage { resolving, connecting, handshaking, hello };
  std::string why(const asio::error_code& ec) const;
  void arm();
  void timed_out();
  template <class Next>
  void send_hello(Next next) {
    hello_out_ = relay_wire::hello_frame(mine_);
    asio::async_write(stream_, asio::buffer(*hello_out_), [self = shared_from_this(), next](const asio::error_code& ec, std::size_t) {
      if (ec) return self->finish(self->refused_text(ec));
      next();
    });
  }
  std::string refused_text(const asio::error_code& ec) const;
  std::string refused_peer() const;
  // After the handshake: the role the peer's certificate grants. A client checks it against the
  // role it dialed at once (finishing with the refusal and returning false otherwise); a server
  // judges it with the hello (role_refusal).
  bool check_certificate_role();
  // "" or why a peer whose hello claims `claimed` is refused: its certificate grants no role or
  // another one, or (server) that role does not connect here.
  std::string role_refusal(relay_role claimed) const;
  void read_hello();
  void succeed();
  void finish(const std::string& err, bool unreachable = false);

  tls_stream stream_;
  asio::steady_timer timer_;
  std::shared_ptr<tcp::resolver> resolver_;
  relay_hello mine_, theirs_;
  std::chrono::milliseconds timeout_;
  relay_heartbeat heartbeat_;
  done_handler done_;
  bool server_ = false, finished_ = false, timed_out_ = false;
  stage stage_ = stage::resolving;
  std::string peer_, what_, peer_cn_, role_problem_;
  std::optional<relay_role> expect_, cert_role_;
  std::vector<relay_role> accepted_;
  std::array<std::uint8_t, relay_wire::header_bytes> header_{};
  std::vector<std::byte> body_;
  relay_wire::frame_ptr hello_out_;
};

/// Accepts relay connections on an endpoint: each one is established (TLS + hello, under
/// `timeout`) and handed to on_link, or refused and reported to on_refused. At most
/// limits.pending handshakes wait at once (limits.per_address from one source address): a new
/// connection beyond either drops the oldest pending one (of that address, or of all; reported
/// as refused, at most once a second with a count). Accept errors back off (10 ms doubling to
/// 1 s; reported once per distinct error). Io thread only.
class listener {
 public:
  using link_handler = std::function<void(std::shared_ptr<relay_link>)>;
  using refusal_handler = std::function<void(const std::string&)>;

  listener(asio::io_context& io, asio::ssl::context& ctx, const relay_endpoint& at, std::string what,
           std::vector<relay_role> accepted, relay_hello mine, std::chrono::milliseconds timeout,
           link_handler on_link, refusal_handler on_refused, relay_accept_limits limits = {},
           relay_heartbeat heartbeat = {});

  void start() { accept_next(); }
  void close();
  /// Where it listens (the actual port when asked for port 0).
  [[nodiscard]] const relay_endpoint& endpoint() const noexcept { return bound_; }
  [[nodiscard]] const std::string& what() const noexcept { return what_; }
  /// Handshakes pending now, and the most pending at once.
  [[nodiscard]] std::size_t pending() const noexcept { return pending_.size(); }
  [[nodiscard]] std::size_t peak_pending() const noexcept { return peak_pending_; }
  /// Pending handshakes dropped for a newer connection, and accept errors, so far.
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }
  [[nodiscard]] std::uint64_t accept_errors() const noexcept { return accept_errors_; }

 private:
  struct pending_handshake {
    std::shared_ptr<establishing> e;
    std::string address;
  };
  void accept_next();
  void admit(std::uint64_t id, std::shared_ptr<establishing> e, std::string address);
  void drop_oldest(const std::string* address);

  asio::io_context* io_;
  asio::ssl::context* ctx_;
  tcp::acceptor acceptor_;
  asio::steady_timer backoff_;
  std::vector<relay_role> accepted_;
  relay_hello mine_;
  std::chrono::milliseconds timeout_;
  link_handler on_link_;
  refusal_handler on_refused_;
  relay_accept_limits limits_;
  relay_heartbeat heartbeat_;
  relay_endpoint bound_;
  std::string what_;
  std::map<std::uint64_t, pending_handshake> pending_;  // by admission order
  std::uint64_t next_id_ = 0, dropped_ = 0, dropped_unreported_ = 0, accept_errors_ = 0;
  std::size_t peak_pending_ = 0;
  std::chrono::milliseconds pause_{0};
  std::string last_accept_error_;
  std::chrono::steady_clock::time_point last_drop_report_{};
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
  void stop(std::function<void()> last);

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace relay_detail
}  // namespace dcr

#include "dcr/detail/protocol/relay/relay_link.inl"
