// tests/protocol/test_relay_hostile.cpp: the relay (dcr/protocol/relay/relay.hpp) against hostile and
// broken peers on 127.0.0.1 (issue 20): roles forged against the certificates, and servers whose
// certificate names another address; counts from the wire that would size huge allocations,
// malformed manifests a root would forward; an owner that ignores the root's window and a root
// that announces a huge payload; a flood of silent connections and an accept loop out of
// descriptors; a root frozen with SIGSTOP and one that drops; connects that never finish.
// Every wait is bounded. Raw peers are made of the relay's own pieces (relay_detail::establishing
// and relay_link), so they speak the protocol exactly, with whatever certificate and role.
#include "relay_test_support.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>

using namespace relay_test;
namespace wire = dcr::relay_wire;

namespace {

/// A peer that establishes one connection with the given certificate, claiming `claims`, then
/// sends frames at will and records what it hears.
struct raw_peer {
  dcr::relay_detail::io_thread io;
  asio::ssl::context ctx;
  std::shared_ptr<dcr::relay_link> link;  // io thread
  mutable std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<dcr::relay_frame, wire::frame_ptr>> heard;
  std::string error, closed;
  bool connected = false;

  raw_peer(const dcr::relay_tls& files, dcr::relay_role claims, const dcr::relay_endpoint& to,
           std::optional<dcr::relay_role> expect, std::uint64_t window = 0)
      : ctx(dcr::relay_detail::make_context(files, false)) {
    std::promise<void> done;
    auto f = done.get_future();
    asio::post(io.io(), [&] {
      auto e = std::make_shared<dcr::relay_detail::establishing>(
          io.io(), ctx, dcr::relay_hello{claims, window, "hostile peer"}, 5000ms,
          [this, &done](std::shared_ptr<dcr::relay_link> l, const std::string& err, bool) {
            {
              std::lock_guard lock(m);
              error = err;
              connected = l != nullptr;
            }
            link = l;
            if (l)
              l->start(
                  [this](dcr::relay_frame t, const wire::frame_ptr& fr) {
                    std::lock_guard lock(m);
                    heard.emplace_back(t, fr);
                    cv.notify_all();
                  },
                  [this](const std::string& why) {
                    std::lock_guard lock(m);
                    closed = why.empty() ? "closed" : why;
                    cv.notify_all();
                  });
            done.set_value();
          });
      e->dial(to, "server", expect);
    });
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
  }
  ~raw_peer() {
    io.stop([this] {
      if (link) link->close("test over");
    });
  }
  void send(wire::frame_ptr f) {
    io.call([&] {
      if (link) link->send(f);
    });
  }
  /// Waits for a frame of type t (true) or the connection's end / 10 s (false).
  bool wait_for(dcr::relay_frame t, protocol_clock::duration limit = 10s) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, limit, [&] {
      return !closed.empty() ||
             std::any_of(heard.begin(), heard.end(), [&](auto& h) { return h.first == t; });
    }) && closed.empty();
  }
  /// Not established, or established and ended since.
  bool refused_or_closed() const {
    std::lock_guard lock(m);
    return !connected || !closed.empty();
  }
  bool wait_closed(protocol_clock::duration limit = 10s) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, limit, [&] { return !closed.empty(); });
  }
  std::string nack_reasons() const {
    std::lock_guard lock(m);
    std::string out;
    for (auto& [t, f] : heard)
      if (t == dcr::relay_frame::nack) {
        wire::reader r({f->data() + wire::header_bytes, f->size() - wire::header_bytes}, t);
        (void)r.u8();
        (void)r.id();
        out += r.str() + "\n";
      }
    return out;
  }
};

long peak_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int threads_now() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

/// Lowers the soft descriptor limit for a scope.
struct fd_limit {
  rlimit saved{};
  explicit fd_limit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved);
    rlimit l = saved;
    l.rlim_cur = std::min<rlim_t>(soft, saved.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &l) == 0);
  }
  ~fd_limit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

int highest_fd() {
  int top = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) top = std::max(top, std::stoi(e.path().filename().string()));
  return top;
}

/// An attempt frame naming `count` receivers and carrying none (24 bytes of body).
wire::frame_ptr attempt_claiming(std::uint32_t count) { return wire::writer(dcr::relay_frame::attempt).key(key1).u32(count).done(); }

/// A manifest frame claiming `count` payloads and listing none.
wire::frame_ptr manifest_claiming(std::uint32_t count) {
  return wire::writer(dcr::relay_frame::manifest).key(key1).u32(0).u32(count).done();
}

}  // namespace

// First in the file: the peak resident size of the process is still low, so a huge allocation
// (the defect) shows in it.
TEST_CASE("relay hostile: counts from the wire are checked against the frame before anything is sized by them") {
  tree t(1, 1);
  dcr::relay_node::source rx(*t.nodes[0], "r0");
  t.wait_connected({1});
  const auto node = t.nodes[0]->endpoint();
  const auto rss_before = peak_rss_kib();

  SUBCASE("a root's attempt frame claiming 4294967295 receivers in 24 bytes") {
    raw_peer root(tls("root"), dcr::relay_role::root, node, dcr::relay_role::node);
    REQUIRE(root.connected);
    const auto t0 = protocol_clock::now();
    root.send(attempt_claiming(0xffffffffu));
    REQUIRE(root.wait_closed());
    CHECK(protocol_clock::now() - t0 < 2s);
    INFO(t.log.all());
    CHECK(eventually([&] { return t.log.contains("claims 4294967295 receivers in 0 remaining bytes"); }));
  }
  SUBCASE("a root's manifest claiming 16777216 payloads in 28 bytes") {
    raw_peer root(tls("root"), dcr::relay_role::root, node, dcr::relay_role::node);
    REQUIRE(root.connected);
    root.send(wire::attempt_frame(key1, std::vector<std::string>{"r0"}));
    const auto t0 = protocol_clock::now();
    root.send(manifest_claiming(std::uint32_t{1} << 24));
    REQUIRE(root.wait_closed());
    CHECK(protocol_clock::now() - t0 < 2s);
    INFO(t.log.all());
    CHECK(eventually([&] { return t.log.contains("claims 16777216 payloads in 0 remaining bytes"); }));
    // Nothing was sized by the count (16 Mi payload ids would be 512 MiB).
    CHECK(peak_rss_kib() - rss_before < 64 * 1024);
  }
  SUBCASE("an owner's malformed manifest is refused by the root, never forwarded to the nodes") {
    raw_peer owner(tls("owner"), dcr::relay_role::owner, t.roots[0]->endpoint(), dcr::relay_role::root);
    REQUIRE(owner.connected);
    owner.send(wire::attempt_frame(key1, std::vector<std::string>{"r0"}));
    REQUIRE(owner.wait_for(dcr::relay_frame::ready));
    owner.send(manifest_claiming(std::uint32_t{1} << 24));
    REQUIRE(owner.wait_closed());
    INFO(t.log.all());
    CHECK(eventually([&] { return t.log.contains("claims 16777216 payloads in 0 remaining bytes"); }));
    std::this_thread::sleep_for(200ms);
    // The node never saw it (it would have dropped its root, and the root the node).
    CHECK_FALSE(t.log.contains("node 0 " + node.text() + ": root"));
    CHECK_FALSE(t.log.contains(": node " + node.text() + " lost"));
    CHECK(t.nodes[0]->roots_connected() == 1);
    CHECK(t.roots[0]->stats().nodes_connected == 1);
  }
}

TEST_CASE("relay hostile: a peer's role is the one its certificate grants; a mismatch is refused naming peer, claimed role and certificate") {
  tree t(1, 1);
  dcr::relay_node::source rx(*t.nodes[0], "r0");
  t.wait_connected({1});
  const auto node = t.nodes[0]->endpoint();
  const auto root = t.roots[0]->endpoint();
  auto refused_at_node = [&] {
    REQUIRE(eventually([&] { return !t.nodes[0]->refusals().empty(); }));
    return t.nodes[0]->refusals().front();
  };
  auto refused_at_root = [&] {
    REQUIRE(eventually([&] { return !t.roots[0]->refusals().empty(); }));
    return t.roots[0]->refusals().front();
  };

  SUBCASE("a peer holding the owner certificate claims to be a root at a node") {
    raw_peer fake(tls("owner"), dcr::relay_role::root, node, dcr::relay_role::node);
    const auto refusal = refused_at_node();
    INFO(refusal);
    CHECK(refusal.find("refused peer 127.0.0.1:") != std::string::npos);
    CHECK(refusal.find("it claims to be a root, but its certificate (CN=owner) grants the role owner") != std::string::npos);
    CHECK(eventually([&] { return fake.refused_or_closed(); }, 2s));
    CHECK(t.nodes[0]->roots_connected() == 1);  // the real root only
  }
  SUBCASE("a peer holding the node certificate claims to be a root at a node") {
    raw_peer fake(tls("node"), dcr::relay_role::root, node, dcr::relay_role::node);
    const auto refusal = refused_at_node();
    INFO(refusal);
    CHECK(refusal.find("it claims to be a root, but its certificate (CN=node) grants the role node") != std::string::npos);
    CHECK(t.nodes[0]->roots_connected() == 1);
  }
  SUBCASE("a peer holding the owner certificate claims to be a root at a root") {
    raw_peer fake(tls("owner"), dcr::relay_role::root, root, dcr::relay_role::root);
    const auto refusal = refused_at_root();
    INFO(refusal);
    CHECK(refusal.find("it claims to be a root, but its certificate (CN=owner) grants the role owner") != std::string::npos);
    CHECK(t.roots[0]->stats().owners_connected == 0);
  }
  SUBCASE("a peer holding the root certificate claims to be an owner at a root") {
    raw_peer fake(tls("root"), dcr::relay_role::owner, root, dcr::relay_role::root);
    const auto refusal = refused_at_root();
    INFO(refusal);
    CHECK(refusal.find("it claims to be an owner, but its certificate (CN=root) grants the role root") != std::string::npos);
  }
  SUBCASE("a certificate that grants no role") {
    raw_peer fake(tls("norole"), dcr::relay_role::owner, root, dcr::relay_role::root);
    const auto refusal = refused_at_root();
    INFO(refusal);
    CHECK(refusal.find("its certificate (CN=norole) grants no relay role") != std::string::npos);
  }
  SUBCASE("an owner refuses a root that holds the owner certificate, or the node certificate") {
    for (const char* cert : {"owner", "node"}) {
      auto o = t.root_options;
      o.listen = any_port;
      o.tls = tls(cert);
      o.name = std::string("fake root with the ") + cert + " certificate";
      dcr::relay_root fake(o);
      auto oo = t.owner_options(0);
      oo.roots = {fake.endpoint()};
      dcr::relay_owner_store store(oo);
      const auto t0 = protocol_clock::now();
      const auto err = message_of([&] { store.open_attempt(key1, std::vector<std::string>{"r0"}, soon()); });
      INFO(err);
      CHECK(err.find("root " + fake.endpoint().text() + " refused: it is dialed as a root, but its certificate (CN=" + cert + ") grants the role " + cert) != std::string::npos);
      CHECK(protocol_clock::now() - t0 < 2s);
      // The node refuses it too (it dials the node with a certificate that is not a root's).
      CHECK(fake.stats().nodes_connected == 0);
    }
  }
  SUBCASE("an owner refuses a root whose certificate is not issued for the address it dialed") {
    auto o = t.root_options;
    o.listen = any_port;
    o.tls = tls("far");  // a root's certificate, for DNS:elsewhere.invalid only
    o.name = "misnamed root";
    dcr::relay_root far(o);
    auto oo = t.owner_options(0);
    oo.roots = {far.endpoint()};
    dcr::relay_owner_store store(oo);
    const auto err = message_of([&] { store.open_attempt(key1, std::vector<std::string>{"r0"}, soon()); });
    INFO(err);
    CHECK(err.find("TLS handshake with root " + far.endpoint().text() + " failed") != std::string::npos);
    CHECK(err.find("IP address mismatch") != std::string::npos);
    CHECK(err.find("not issued for the address 127.0.0.1") != std::string::npos);
  }
  CHECK(t.nodes[0]->stats().payloads_received == 0);
}

TEST_CASE("relay hostile: the root enforces the owner's window; no payload beyond the limits is sized") {
  SUBCASE("an owner that sends beyond its credit is disconnected; the root holds at most the window") {
    constexpr std::uint64_t window = 256 << 10;
    tree t(1, 1, 64 << 10, window);
    dcr::relay_node::source rx(*t.nodes[0], "r0");  // never drained: the node stays full
    t.wait_connected({1});
    raw_peer owner(tls("owner"), dcr::relay_role::owner, t.roots[0]->endpoint(), dcr::relay_role::root);
    REQUIRE(owner.connected);
    owner.send(wire::attempt_frame(key1, std::vector<std::string>{"r0"}));
    REQUIRE(owner.wait_for(dcr::relay_frame::ready));
    // A first payload fills the node (admitted alone); a second must wait at the root, and its
    // chunks are sent without waiting for credit: 1 MiB against a 256 KiB window.
    owner.send(wire::chunk_frame({key1, 0, 0}, 128 << 10, 0, random_bytes(128 << 10, 1)));
    const auto chunk = random_bytes(64 << 10, 2);
    for (std::uint64_t k = 0; k < 16; ++k) owner.send(wire::chunk_frame({key1, 0, 1}, 1 << 20, k * (64 << 10), chunk));
    REQUIRE(owner.wait_closed());
    INFO(t.log.all());
    CHECK(eventually([&] { return t.log.contains("overran the window of 262144 bytes it was granted"); }));
    CHECK(t.roots[0]->stats().peak_buffered_bytes <= window);
  }
  SUBCASE("a root announcing a 2 GiB payload: the node nacks it without sizing it") {
    tree t(1, 1, std::uint64_t{256} << 20, std::uint64_t{8} << 20,
           [](dcr::relay_node_options& n, dcr::relay_root_options&) { n.max_payload_bytes = 1 << 20; });
    dcr::relay_node::source rx(*t.nodes[0], "r0");
    t.wait_connected({1});
    raw_peer root(tls("root"), dcr::relay_role::root, t.nodes[0]->endpoint(), dcr::relay_role::node);
    REQUIRE(root.connected);
    root.send(wire::attempt_frame(key1, std::vector<std::string>{"r0"}));
    root.send(wire::chunk_frame({key1, 0, 0}, std::uint64_t{2} << 30, 0, random_bytes(100, 3)));
    REQUIRE(root.wait_for(dcr::relay_frame::nack));
    INFO(root.nack_reasons());
    CHECK(root.nack_reasons().find("of 2147483648 bytes exceeds the largest payload assembled here (1048576 bytes)") != std::string::npos);
    CHECK(t.nodes[0]->stats().peak_held_bytes == 0);
  }
  SUBCASE("a payload beyond the root's limit is nacked to its owner") {
    tree t(1, 1, std::uint64_t{256} << 20, std::uint64_t{8} << 20,
           [](dcr::relay_node_options&, dcr::relay_root_options& r) { r.max_payload_bytes = 64 << 10; });
    dcr::relay_node::source rx(*t.nodes[0], "r0");
    t.wait_connected({1});
    dcr::relay_owner_store store(t.owner_options(0));
    store.open_attempt(key1, std::vector<std::string>{"r0"}, soon());
    const std::vector<dcr::payload_id> ids{{key1, 0, 0}};
    const auto err = message_of([&] {
      store.put(ids[0], random_bytes(100 << 10, 4));
      store.put_manifest(key1, 0, ids);
    });
    INFO(err);
    CHECK(err.find("of 102400 bytes exceeds the largest payload forwarded here (65536 bytes)") != std::string::npos);
    CHECK(t.nodes[0]->stats().payloads_received == 0);
  }
}

TEST_CASE("relay hostile: a flood of silent connections neither exhausts descriptors nor keeps a real owner out") {
  tree t(1, 1, std::uint64_t{256} << 20, std::uint64_t{8} << 20,
         [](dcr::relay_node_options&, dcr::relay_root_options& r) { r.accept_limits = {32, 8}; });
  dcr::relay_node::source rx(*t.nodes[0], "r0");
  t.wait_connected({1});
  constexpr int flood = 300;
  // Room for the flood's own sockets and 48 more: a root that holds every pending handshake
  // runs out of descriptors (and then the owner cannot get in); one that holds 32 does not.
  fd_limit limit(static_cast<rlim_t>(highest_fd() + 1 + flood + 48));
  std::vector<int> silent;
  for (int k = 0; k < flood; ++k) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(s >= 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7f000002u + static_cast<std::uint32_t>(k % 10));  // 127.0.0.2-11
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(0x7f000001u);
    to.sin_port = htons(t.roots[0]->endpoint().port);
    REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    silent.push_back(s);
  }
  std::this_thread::sleep_for(300ms);  // the root accepts what it will
  auto o = t.owner_options(0);
  o.connect_timeout = 5000ms;
  dcr::relay_owner_store store(o);
  const auto t0 = protocol_clock::now();
  const auto err = message_of([&] { store.open_attempt(key1, std::vector<std::string>{"r0"}, protocol_clock::now() + 8s); });
  const auto took = protocol_clock::now() - t0;
  for (int s : silent) ::close(s);
  INFO(err);
  INFO(t.log.all());
  CHECK(err == "");
  CHECK(took < 4s);
  const auto s = t.roots[0]->stats();
  CHECK(s.peak_pending_handshakes <= 32);
  CHECK(s.dropped_handshakes > 0);
}

TEST_CASE("relay hostile: accept errors back off instead of spinning; accepting resumes") {
  tree t(0, 1);
  const auto node = t.nodes[0]->endpoint();
  {
    // A connection arrives while the process is out of descriptors: the node cannot accept it.
    const int c = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(c >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(0x7f000001u);
    to.sin_port = htons(node.port);
    std::vector<int> filler;
    double cpu = 0;
    {
      fd_limit limit(static_cast<rlim_t>(highest_fd() + 1));
      for (int f; (f = ::dup(c)) >= 0;) filler.push_back(f);  // fill any gaps below the limit
      REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
      std::this_thread::sleep_for(50ms);
      const auto c0 = cpu_seconds();
      std::this_thread::sleep_for(1s);
      cpu = cpu_seconds() - c0;
    }
    for (int f : filler) ::close(f);
    ::close(c);
    INFO("CPU while out of descriptors: " << cpu << " s");
    CHECK(cpu < 0.25);  // a spinning accept loop burns the whole second
  }
  CHECK(eventually([&] { return t.log.contains("cannot accept a connection: Too many open files"); }, 2s));
  // A real root still gets in.
  auto o = t.root_options;
  o.listen = any_port;
  o.nodes = {node};
  dcr::relay_root root(o);
  CHECK(eventually([&] { return root.stats().nodes_connected == 1; }, 5s));
}

TEST_CASE("relay hostile: a root frozen with SIGSTOP fails the owner's attempt within the heartbeat timeout") {
  (void)certs();  // made before the fork
  REQUIRE_MESSAGE(threads_now() == 1, "the fork below needs a single-threaded process");
  int port_pipe[2];
  REQUIRE(::pipe(port_pipe) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // a node with receiver r0 and a root, in a process of their own
    ::close(port_pipe[0]);
    try {
      dcr::relay_node_options no;
      no.tls = tls("node");
      no.listen = any_port;
      dcr::relay_node node(no);
      dcr::relay_node::source rx(node, "r0");
      dcr::relay_root_options ro;
      ro.tls = tls("root");
      ro.listen = any_port;
      ro.nodes = {node.endpoint()};
      ro.heartbeat = {200ms, 1000ms};
      dcr::relay_root root(ro);
      const std::uint16_t port = root.endpoint().port;
      if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(port_pipe[1]);
  struct reaper {
    pid_t pid;
    ~reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  pollfd p{port_pipe[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 20000) == 1);
  std::uint16_t port = 0;
  REQUIRE(::read(port_pipe[0], &port, sizeof port) == sizeof port);
  ::close(port_pipe[0]);

  dcr::relay_owner_options o;
  o.roots = {{"127.0.0.1", port}};
  o.tls = tls("owner");
  o.name = "owner 0";
  o.heartbeat = {200ms, 1000ms};
  dcr::relay_owner_store store(o);
  const auto deadline = protocol_clock::now() + 10s;
  store.open_attempt(key1, std::vector<std::string>{"r0"}, deadline);
  store.put({key1, 0, 0}, random_bytes(1000, 5));
  REQUIRE(::kill(child, SIGSTOP) == 0);
  const auto t0 = protocol_clock::now();
  const std::vector<dcr::payload_id> ids{{key1, 0, 0}};
  const auto err = message_of([&] { store.put_manifest(key1, 0, ids); });
  const auto took = protocol_clock::now() - t0;
  INFO(err);
  CHECK(err.find("root 127.0.0.1:" + std::to_string(port) + " lost") != std::string::npos);
  CHECK(err.find("heartbeat timeout") != std::string::npos);
  CHECK(took < 4s);
}

TEST_CASE("relay hostile: a root connection that drops fails the owner's attempt at once") {
  tree t(2, 1);
  dcr::relay_node::source a(*t.nodes[0], "a");
  t.wait_connected({1});
  dcr::relay_owner_store store(t.owner_options(0));
  store.open_attempt(key1, std::vector<std::string>{"a"}, soon());
  store.put({key1, 0, 0}, random_bytes(1000, 6));  // (0 + 0) mod 2: root 0; the manifest too
  const auto port = t.roots[1]->endpoint().port;
  t.roots[1].reset();  // carried nothing of this owner's, but other owners' payloads are lost
  std::this_thread::sleep_for(300ms);
  std::thread receiver([&] { (void)drain(a, key1, {0}, 1s); });
  const std::vector<dcr::payload_id> ids{{key1, 0, 0}};
  const auto err = message_of([&] { store.put_manifest(key1, 0, ids); });
  receiver.join();
  INFO(err);
  CHECK(err.find("root 127.0.0.1:" + std::to_string(port) + " lost during attempt t0-1-a0") != std::string::npos);
}

TEST_CASE("relay hostile: every connect ends by connect_timeout and by the attempt's deadline") {
  // A server that accepts TCP connections (its backlog) and never answers the TLS handshake.
  asio::io_context io;
  asio::ip::tcp::acceptor silent(io, {asio::ip::make_address("127.0.0.1"), 0});
  const dcr::relay_endpoint at{"127.0.0.1", silent.local_endpoint().port()};
  dcr::relay_owner_options o;
  o.roots = {at};
  o.tls = tls("owner");
  o.name = "owner 0";
  o.handshake_timeout = 10000ms;
  SUBCASE("connect_timeout") {
    o.connect_timeout = 500ms;
    dcr::relay_owner_store store(o);
    const auto t0 = protocol_clock::now();
    const auto err = message_of([&] { store.open_attempt(key1, std::vector<std::string>{"r0"}, protocol_clock::now() + 20s); });
    INFO(err);
    CHECK(err.find("root " + at.text()) != std::string::npos);
    CHECK(err.find("timed out after") != std::string::npos);
    CHECK(protocol_clock::now() - t0 < 2500ms);
  }
  SUBCASE("the attempt's deadline") {
    o.connect_timeout = 10000ms;
    dcr::relay_owner_store store(o);
    const auto t0 = protocol_clock::now();
    const auto err = message_of([&] { store.open_attempt(key1, std::vector<std::string>{"r0"}, protocol_clock::now() + 600ms); });
    INFO(err);
    CHECK(err.find("root " + at.text()) != std::string::npos);
    CHECK(protocol_clock::now() - t0 < 2500ms);
  }
}
