// The S3 payload store against a real S3-compatible server that checks SigV4 signatures
// (SeaweedFS, started by scripts/with-s3.sh, which sets DCR_S3_ENDPOINT, DCR_S3_VHOST_ENDPOINT,
// DCR_S3_BUCKET, DCR_S3_PID and the AWS_* credentials): the payload-store contract (put once,
// equal bytes again a no-op, other bytes an error; manifests; listing as it fills; absent gets;
// erase_through), multipart uploads, pagination, both addressing styles, a wrong secret refused
// with a clear error, retries (a frozen server; a scripted server answering 503 and 500), a
// cross-check with an independent client (boto3), prefetching and fan-out over S3, and the real
// agents refitting over S3 with owner and receiver faults, bit-exact.
//
// Without DCR_S3_ENDPOINT the test is skipped (exit 77), or fails when CI is set. Every test
// works under a fresh key prefix.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "agents_harness.hpp"
#include "dcr/protocol/store/fanout_store.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "s3_test_support.hpp"
#include "service_test_support.hpp"

namespace {

using namespace std::chrono_literals;

using dcr_test::env;

// A key prefix no other test (nor an earlier run) has used.
std::string fresh_prefix() { return dcr_test::unique_prefix("test-", "/"); }

dcr::s3_options options(std::string prefix = fresh_prefix()) {
  return dcr_test::server_options(std::move(prefix), 200ms);
}

using dcr_test::bytes_of;
using dcr_test::error_of;
using dcr_test::pattern;

dcr::payload_id pid(std::uint32_t owner, std::uint32_t seq, std::uint64_t base = 1, std::uint64_t target = 2,
                    std::uint32_t attempt = 0) {
  return {{base, target, attempt}, owner, seq};
}

// Stops the S3 server (SIGSTOP) for `d` from now, resumed in the background; without a duration,
// until the freeze is destroyed (for a request that must fail however late the test's own thread
// gets to run on a loaded machine). The destructor resumes it at the latest.
struct freeze {
  pid_t pid;
  std::jthread thread;
  explicit freeze(std::chrono::milliseconds d = {}) : pid(static_cast<pid_t>(std::stol(env("DCR_S3_PID")))) {
    REQUIRE(::kill(pid, SIGSTOP) == 0);
    if (d == std::chrono::milliseconds{}) return;
    thread = std::jthread([p = pid, d](std::stop_token) {
      std::this_thread::sleep_for(d);
      ::kill(p, SIGCONT);
    });
  }
  ~freeze() {
    if (thread.joinable()) thread.join();
    ::kill(pid, SIGCONT);
  }
};

// A scripted HTTP server on 127.0.0.1: answers request k with responses[min(k, last)] and closes
// the connection; counts the requests.
class scripted_server {
 public:
  struct reply {
    int status;
    std::string body;
  };
  explicit scripted_server(std::vector<reply> replies) : replies_(std::move(replies)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~scripted_server() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] int requests() const { return requests_.load(); }
  [[nodiscard]] std::string last_request() const {
    std::lock_guard lock(mutex_);
    return last_;
  }
  [[nodiscard]] std::vector<std::string> request_lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const auto n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
      // The body too (Content-Length), so that the client never writes into a closed socket.
      std::string lower = req;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
      const auto head_end = req.find("\r\n\r\n");
      if (const auto at = lower.find("\r\ncontent-length:"); at != std::string::npos && head_end != std::string::npos) {
        const auto length = std::stoul(req.substr(at + 17));
        while (req.size() < head_end + 4 + length) {
          const auto n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          req.append(buf, static_cast<std::size_t>(n));
        }
      }
      {
        std::lock_guard lock(mutex_);
        last_ = req;
        lines_.push_back(req.substr(0, req.find("\r\n")));
      }
      const auto k = static_cast<std::size_t>(requests_++);
      const auto& r = replies_[std::min(k, replies_.size() - 1)];
      const std::string head = "HTTP/1.1 " + std::to_string(r.status) + " X\r\nContent-Length: " +
                               std::to_string(r.body.size()) + "\r\nETag: \"e\"\r\nConnection: close\r\n\r\n";
      const std::string all = head + r.body;
      (void)::send(c, all.data(), all.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }
  std::vector<reply> replies_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  mutable std::mutex mutex_;
  std::string last_;
  std::vector<std::string> lines_;
  std::thread thread_;
};

std::string s3_error(const char* code, const char* message) {
  return std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>") + code + "</Code><Message>" +
         message + "</Message></Error>";
}

// Runs a shell command; returns its exit status and output.
std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (const auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A bare signed client for the options' bucket (requests the store does not make).
dcr::detail::s3::client_config raw_config(const dcr::s3_options& o) {
  dcr::detail::s3::client_config c;
  c.scheme = "http";
  c.authority = o.endpoint.substr(7);
  c.bucket = o.bucket;
  c.region = o.region;
  c.access_key_id = o.credentials.access_key_id;
  c.secret_access_key = o.credentials.secret_access_key;
  return c;
}

// The incomplete multipart uploads under the options' prefix.
std::size_t open_uploads(const dcr::s3_options& o) {
  dcr::detail::s3::client raw(raw_config(o));
  dcr::detail::s3::request r;
  r.method = "GET";
  r.query = {{"uploads", ""}, {"prefix", o.prefix}};
  return dcr::detail::s3::elements(raw.call(r).text, "Upload").size();
}

using s3_cluster = dcr_test::cluster<dcr::memory_control_plane, dcr::s3_payload_store, dcr::prefetch_source>;

}  // namespace

// ---- the payload-store contract

TEST_CASE("put once: equal bytes again are a no-op, other bytes an error naming the bucket and key") {
  dcr::s3_payload_store s(options());
  s.check_access();
  const auto id = pid(7, 0);
  std::vector<std::byte> out;
  CHECK(s.get(id, out) == dcr::get_status::absent);
  const auto bytes = pattern(10000, 1);
  s.put(id, bytes);
  CHECK(s.get(id, out) == dcr::get_status::found);
  CHECK(out == bytes);
  s.put(id, bytes);  // no-op
  CHECK(s.stats().objects_put == 1);
  const auto what = error_of([&] { s.put(id, pattern(10000, 2)); });
  CHECK(what.find("s3://" + s.bucket() + "/" + s.payload_key(id)) != std::string::npos);
  CHECK(what.find("put again with other bytes") != std::string::npos);
  CHECK(s.get(id, out) == dcr::get_status::found);
  CHECK(out == bytes);  // the first bytes stay
  // An empty payload is a payload too.
  s.put(pid(7, 1), {});
  CHECK(s.get(pid(7, 1), out) == dcr::get_status::found);
  CHECK(out.empty());
}

TEST_CASE("without conditional writes (HEAD first) the semantics are the same") {
  auto o = options();
  o.conditional_writes = false;
  dcr::s3_payload_store s(o);
  const auto bytes = pattern(3000, 3);
  s.put(pid(1, 0), bytes);
  s.put(pid(1, 0), bytes);
  CHECK(s.stats().objects_put == 1);
  CHECK(error_of([&] { s.put(pid(1, 0), pattern(3000, 4)); }).find("put again with other bytes") != std::string::npos);
}

TEST_CASE("listing as the attempt fills; manifests; owners apart; other attempts apart") {
  dcr::s3_payload_store s(options());
  const dcr::attempt_key key{1, 2, 0};
  CHECK(s.list(key).empty());
  s.put(pid(9, 1), bytes_of("nine-1"));
  s.put(pid(9, 0), bytes_of("nine-0"));
  s.put(pid(3, 0), bytes_of("three-0"));
  s.put(pid(3, 0, 1, 2, 1), bytes_of("other attempt"));
  auto l = s.list(key);
  REQUIRE(l.size() == 2);
  CHECK(l[0].owner == 3);
  CHECK(l[1].owner == 9);
  CHECK_FALSE(l[0].complete);
  CHECK(l[1].ids == std::vector<dcr::payload_id>{pid(9, 0), pid(9, 1)});
  // A manifest naming a payload that was not put is refused, and changes nothing.
  const auto what = error_of([&] {
    s.put_manifest(key, 9, std::vector<dcr::payload_id>{pid(9, 0), pid(9, 1), pid(9, 2)});
  });
  CHECK(what.find("not put for its attempt") != std::string::npos);
  CHECK(what.find(s.manifest_key(key, 9)) != std::string::npos);
  CHECK_FALSE(s.list(key)[1].complete);
  // Another owner's or attempt's id is refused too.
  CHECK_THROWS_AS(s.put_manifest(key, 9, std::vector<dcr::payload_id>{pid(3, 0)}), dcr::error);
  // The manifest makes the owner complete with exactly its list (here a subset of what is there).
  s.put_manifest(key, 9, std::vector<dcr::payload_id>{pid(9, 1)});
  l = s.list(key);
  CHECK(l[1].complete);
  CHECK(l[1].ids == std::vector<dcr::payload_id>{pid(9, 1)});
  CHECK(l[1].sizes == std::vector<std::uint64_t>{6});
  s.put_manifest(key, 9, std::vector<dcr::payload_id>{pid(9, 0), pid(9, 1)});  // replaced
  CHECK(s.list(key)[1].ids == std::vector<dcr::payload_id>{pid(9, 0), pid(9, 1)});
  // The manifest records each payload's size, from the listing of what was put.
  CHECK(s.list(key)[1].sizes == std::vector<std::uint64_t>{6, 6});
  CHECK(s.list(key)[0].sizes.empty());  // owner 3: no manifest yet
  // An owner with nothing to send: a complete, empty listing.
  s.put_manifest(key, 12, std::vector<dcr::payload_id>{});
  l = s.list(key);
  REQUIRE(l.size() == 3);
  CHECK(l[2].owner == 12);
  CHECK(l[2].complete);
  CHECK(l[2].ids.empty());
  CHECK(s.list(dcr::attempt_key{1, 2, 1}).size() == 1);
}

TEST_CASE("an object replaced after its owner's manifest is refused by the sources, longer or shorter") {
  // Another writer (not dcr: its puts are conditional) replaces a payload object after the
  // manifest recorded its size: the sources cap the get at that size and never deliver it.
  dcr::s3_payload_store s(options());
  const dcr::attempt_key key{1, 2, 0};
  s.put(pid(4, 0), pattern(5000, 1));
  s.put(pid(4, 1), pattern(5000, 2));
  s.put_manifest(key, 4, std::vector<dcr::payload_id>{pid(4, 0), pid(4, 1)});
  dcr::detail::s3::client raw(raw_config(options()));
  for (const std::size_t replaced : {9000, 4000}) {
    CAPTURE(replaced);
    const auto body = pattern(replaced, 3);
    dcr::detail::s3::request put;
    put.method = "PUT";
    put.key = s.payload_key(pid(4, 1));
    put.body = body;
    raw.call(put);
    dcr::prefetch_source src(s, dcr::prefetch_options{2, 0, std::chrono::milliseconds(5)});
    src.open(key, std::vector<std::uint32_t>{4});
    dcr::delivery d;
    const auto what = error_of([&] {
      while (src.next(d, dcr::protocol_clock::now() + std::chrono::seconds(20)) ==
             dcr::source_status::delivered)
        CHECK(d.id == pid(4, 0));
    });
    CHECK_MESSAGE(what.find(replaced > 5000 ? "exceeds the cap of 5000 bytes"
                                            : "got 4000 bytes, its owner's manifest says 5000") !=
                      std::string::npos,
                  what);
  }
}

TEST_CASE("erase_through drops every object of transitions with target <= v, restores included") {
  dcr::s3_payload_store s(options());
  for (auto [b, t] : {std::pair{0, 1}, {1, 2}, {2, 2}, {2, 3}, {9, 10}}) {
    const auto id = pid(4, 0, static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(t));
    s.put(id, bytes_of("x"));
    const auto other = pid(4, 1, id.attempt.base_version, id.attempt.target_version);
    s.put(other, bytes_of("y"));
    s.put_manifest(id.attempt, 4, std::vector<dcr::payload_id>{id, other});
  }
  s.erase_through(2);
  std::vector<std::byte> out;
  CHECK(s.get(pid(4, 0, 0, 1), out) == dcr::get_status::absent);
  CHECK(s.get(pid(4, 1, 1, 2), out) == dcr::get_status::absent);
  CHECK(s.get(pid(4, 0, 2, 2), out) == dcr::get_status::absent);
  CHECK(s.list(dcr::attempt_key{1, 2, 0}).empty());
  CHECK(s.get(pid(4, 0, 2, 3), out) == dcr::get_status::found);
  CHECK(s.list(dcr::attempt_key{2, 3, 0}).at(0).complete);
  CHECK(s.get(pid(4, 0, 9, 10), out) == dcr::get_status::found);
  CHECK(s.stats().objects_deleted == 9);
  s.erase_through(100);
  CHECK(s.list(dcr::attempt_key{9, 10, 0}).empty());
  // Only this store's prefix is touched.
  dcr::s3_payload_store a(options()), b(options());
  a.put(pid(1, 0), bytes_of("a"));
  b.put(pid(1, 0), bytes_of("b"));
  a.erase_through(5);
  CHECK(b.get(pid(1, 0), out) == dcr::get_status::found);
}

TEST_CASE("multipart: large payloads go up in parts, read back bit for bit, put once") {
  auto o = options();
  o.multipart_threshold = 1 << 20;
  o.part_size = 5 << 20;  // S3's smallest part
  dcr::s3_payload_store s(o);
  const auto big = pattern((11 << 20) + 123, 5);
  const auto t0 = std::chrono::steady_clock::now();
  s.put(pid(2, 0), big);
  const double put_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s.stats().multipart_uploads == 1);
  std::vector<std::byte> out;
  const auto t1 = std::chrono::steady_clock::now();
  REQUIRE(s.get(pid(2, 0), out) == dcr::get_status::found);
  const double get_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  CHECK(out == big);
  MESSAGE("multipart 11 MiB: put " << big.size() / put_s / 1e6 << " MB/s, get " << big.size() / get_s / 1e6 << " MB/s");
  s.put(pid(2, 0), big);  // no-op: found before any part goes up
  CHECK(s.stats().multipart_uploads == 1);
  auto other = big;
  other[7 << 20] ^= std::byte{1};
  CHECK(error_of([&] { s.put(pid(2, 0), other); }).find("put again with other bytes") != std::string::npos);
  // Parts below S3's minimum are refused when the upload completes: a clear error, the upload
  // aborted, no object.
  auto o2 = options();
  o2.multipart_threshold = 1000;
  o2.part_size = 700;
  dcr::s3_payload_store small(o2);
  const auto what = error_of([&] { small.put(pid(2, 1), pattern(5000, 6)); });
  CHECK(what.find("HTTP 400 EntityTooSmall") != std::string::npos);
  CHECK(what.find(small.payload_key(pid(2, 1))) != std::string::npos);
  CHECK(small.get(pid(2, 1), out) == dcr::get_status::absent);
  CHECK(small.stats().multipart_uploads == 0);
  CHECK(open_uploads(o2) == 0);
}

TEST_CASE("a multipart upload that fails is aborted; erase_through aborts what a killed process left") {
  auto o = options();
  dcr::s3_payload_store s(o);
  dcr::detail::s3::client raw(raw_config(o));
  // A process that died after starting an upload under transition 1 -> 2.
  dcr::detail::s3::request init;
  init.method = "POST";
  init.key = s.payload_key(pid(1, 0));
  init.query = {{"uploads", ""}};
  const auto started = raw.call(init);
  const auto upload_id = dcr::detail::s3::first_text(started.text, "UploadId").value_or("");
  REQUIRE_FALSE(upload_id.empty());
  CHECK(open_uploads(o) == 1);
  s.erase_through(1);  // not that transition's
  CHECK(open_uploads(o) == 1);
  s.erase_through(2);
  CHECK(open_uploads(o) == 0);
  std::vector<std::byte> out;
  CHECK(s.get(pid(1, 0), out) == dcr::get_status::absent);
}

TEST_CASE("pagination: listings and erases read every page") {
  auto o = options();
  o.list_page_size = 2;
  dcr::s3_payload_store s(o);
  const dcr::attempt_key key{1, 2, 0};
  std::vector<dcr::payload_id> ids;
  for (std::uint32_t q = 0; q < 7; ++q) {
    ids.push_back(pid(5, q));
    std::string text(1, 'p');  // (not "p" + ...: a bogus -Wrestrict of GCC 12)
    text += std::to_string(q);
    s.put(ids.back(), bytes_of(text));
  }
  const auto before = s.stats().list_requests;
  auto l = s.list(key);
  REQUIRE(l.size() == 1);
  CHECK(l[0].ids == ids);
  CHECK(s.stats().list_requests - before == 4);
  s.put_manifest(key, 5, ids);  // its check lists every page too
  CHECK(s.list(key).at(0).complete);
  for (std::uint64_t t = 3; t < 8; ++t) s.put(pid(1, 0, t - 1, t), bytes_of("t"));
  s.erase_through(6);
  std::vector<std::byte> out;
  CHECK(s.list(key).empty());
  CHECK(s.get(pid(1, 0, 5, 6), out) == dcr::get_status::absent);
  CHECK(s.get(pid(1, 0, 6, 7), out) == dcr::get_status::found);
}

TEST_CASE("virtual-host addressing and unsigned payloads reach the same objects") {
  const auto prefix = fresh_prefix();
  auto o = options(prefix);
  o.endpoint = env("DCR_S3_VHOST_ENDPOINT");
  o.addressing = dcr::s3_addressing::virtual_host;
  o.payload_hash = dcr::s3_payload_hash::unsigned_payload;
  dcr::s3_payload_store vhost(o);
  vhost.check_access();
  vhost.put(pid(1, 0), bytes_of("by virtual host"));
  dcr::s3_payload_store path(options(prefix));
  std::vector<std::byte> out;
  REQUIRE(path.get(pid(1, 0), out) == dcr::get_status::found);
  CHECK(out == bytes_of("by virtual host"));
  path.put(pid(1, 1), bytes_of("by path"));
  CHECK(vhost.list(dcr::attempt_key{1, 2, 0}).at(0).ids.size() == 2);
}

// ---- refusals

TEST_CASE("a wrong secret is refused (403 SignatureDoesNotMatch) with a clear error; nothing is written") {
  const auto prefix = fresh_prefix();
  auto o = options(prefix);
  o.credentials.secret_access_key = "not-the-secret-" + o.credentials.secret_access_key;
  dcr::s3_payload_store bad(o);
  for (auto op : {0, 1, 2, 3}) {
    CAPTURE(op);
    const auto what = error_of([&] {
      std::vector<std::byte> out;
      if (op == 0) bad.check_access();
      if (op == 1) bad.put(pid(1, 0), bytes_of("x"));
      if (op == 2) (void)bad.get(pid(1, 0), out);
      if (op == 3) (void)bad.list(dcr::attempt_key{1, 2, 0});
    });
    CHECK(what.find("HTTP 403 SignatureDoesNotMatch") != std::string::npos);
    CHECK(what.find("s3://" + o.bucket + "/") != std::string::npos);
    CHECK(what.find(o.credentials.secret_access_key) == std::string::npos);
    CHECK(what.find("after") == std::string::npos);  // not retried
    MESSAGE(what);
  }
  dcr::s3_payload_store good(options(prefix));
  CHECK(good.list(dcr::attempt_key{1, 2, 0}).empty());
  // An unknown access key and a missing bucket are clear too.
  auto unknown = options();
  unknown.credentials.access_key_id = "NOSUCHKEY";
  CHECK(error_of([&] { dcr::s3_payload_store(unknown).check_access(); }).find("HTTP 403") != std::string::npos);
  auto missing = options();
  missing.bucket = "no-such-bucket-dcr";
  const auto what = error_of([&] { dcr::s3_payload_store(missing).check_access(); });
  CHECK(what.find("HTTP 404 NoSuchBucket") != std::string::npos);
  CHECK(what.find("s3://no-such-bucket-dcr/") != std::string::npos);
  // A get from a missing bucket is an error, never an absent payload.
  dcr::s3_payload_store nowhere(missing);
  std::vector<std::byte> out;
  CHECK(error_of([&] { (void)nowhere.get(pid(1, 0), out); }).find("HTTP 404 NoSuchBucket") != std::string::npos);
  CHECK(error_of([&] { nowhere.put(pid(1, 0), bytes_of("x")); }).find("HTTP 404 NoSuchBucket") != std::string::npos);
}

TEST_CASE("retries: 503 SlowDown and 500 are retried with backoff; other 4xx are not") {
  {
    scripted_server server({{503, s3_error("SlowDown", "Please reduce your request rate.")}});
    auto o = options();
    o.endpoint = server.endpoint();
    o.max_retries = 3;
    dcr::s3_payload_store s(o);
    std::vector<std::byte> out;
    const auto t0 = std::chrono::steady_clock::now();
    const auto what = error_of([&] { (void)s.get(pid(1, 0), out); });
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(server.requests() == 4);
    CHECK(what.find("HTTP 503 SlowDown: Please reduce your request rate.") != std::string::npos);
    CHECK(what.find("(after 4 attempts)") != std::string::npos);
    CHECK(waited >= 0.010 + 0.020 + 0.040);  // backoff of at least half of 20, 40, 80 ms
    // Signed the way S3 wants it: libcurl's SigV4 with the hash header, credentials only in it.
    const auto req = server.last_request();
    CHECK(req.find("Authorization: AWS4-HMAC-SHA256 Credential=" + o.credentials.access_key_id + "/") != std::string::npos);
    CHECK(req.find("x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") !=
          std::string::npos);
    CHECK(req.find(o.credentials.secret_access_key) == std::string::npos);
  }
  {
    scripted_server server({{500, s3_error("InternalError", "try again")},
                            {503, ""},
                            {200, "payload bytes"}});
    auto o = options();
    o.endpoint = server.endpoint();
    dcr::s3_payload_store s(o);
    std::vector<std::byte> out;
    CHECK(s.get(pid(1, 0), out) == dcr::get_status::found);
    CHECK(out == bytes_of("payload bytes"));
    CHECK(server.requests() == 3);
  }
  {
    scripted_server server({{400, s3_error("InvalidArgument", "nope")}, {200, "never reached"}});
    auto o = options();
    o.endpoint = server.endpoint();
    dcr::s3_payload_store s(o);
    std::vector<std::byte> out;
    CHECK(error_of([&] { (void)s.get(pid(1, 0), out); }).find("HTTP 400 InvalidArgument: nope") != std::string::npos);
    CHECK(server.requests() == 1);
  }
  {
    // A multipart upload as sent (query parameters in canonical order), where
    // CompleteMultipartUpload answers 200 with an <Error> document: retried, not taken as done.
    scripted_server server({{404, ""},  // HEAD: not there yet
                            {200, "<InitiateMultipartUploadResult><UploadId>u/1=</UploadId></InitiateMultipartUploadResult>"},
                            {200, ""},  // part 1
                            {200, ""},  // part 2
                            {200, s3_error("InternalError", "complete failed")},
                            {200, "<CompleteMultipartUploadResult><Key>k</Key></CompleteMultipartUploadResult>"}});
    auto o = options();
    o.endpoint = server.endpoint();
    o.multipart_threshold = 4;
    o.part_size = 6;
    dcr::s3_payload_store s(o);
    s.put(pid(1, 0), bytes_of("ten bytes!"));
    CHECK(s.stats().multipart_uploads == 1);
    const auto lines = server.request_lines();
    REQUIRE(lines.size() == 6);
    const std::string key = "/" + o.bucket + "/" + s.payload_key(pid(1, 0));
    CHECK(lines[0] == "HEAD " + key + " HTTP/1.1");
    CHECK(lines[1] == "POST " + key + "?uploads= HTTP/1.1");
    CHECK(lines[2] == "PUT " + key + "?partNumber=1&uploadId=u%2F1%3D HTTP/1.1");
    CHECK(lines[3] == "PUT " + key + "?partNumber=2&uploadId=u%2F1%3D HTTP/1.1");
    CHECK(lines[4] == "POST " + key + "?uploadId=u%2F1%3D HTTP/1.1");
    CHECK(lines[5] == lines[4]);
  }
  {
    // A part that fails for good aborts the upload (DELETE ?uploadId=...).
    scripted_server server({{404, ""},
                            {200, "<InitiateMultipartUploadResult><UploadId>u-2</UploadId></InitiateMultipartUploadResult>"},
                            {403, s3_error("AccessDenied", "no parts for you")},
                            {204, ""}});
    auto o = options();
    o.endpoint = server.endpoint();
    o.multipart_threshold = 4;
    o.part_size = 6;
    dcr::s3_payload_store s(o);
    CHECK(error_of([&] { s.put(pid(1, 0), bytes_of("ten bytes!")); }).find("HTTP 403 AccessDenied") != std::string::npos);
    const auto lines = server.request_lines();
    REQUIRE(lines.size() == 4);
    CHECK(lines[3] == "DELETE /" + o.bucket + "/" + s.payload_key(pid(1, 0)) + "?uploadId=u-2 HTTP/1.1");
    CHECK(s.stats().multipart_uploads == 0);
  }
}

TEST_CASE("retries: a frozen server times out requests, which are retried until it is back") {
  auto o = options();
  o.request_timeout = 300ms;
  o.max_retries = 20;
  o.backoff_initial = 50ms;
  o.backoff_max = 200ms;
  dcr::s3_payload_store s(o);
  s.check_access();  // a connection is open before the freeze
  const auto bytes = pattern(200000, 9);
  const auto t0 = std::chrono::steady_clock::now();
  {
    freeze f(1500ms);
    s.put(pid(1, 0), bytes);  // perhaps applied twice by the server after it thaws: a no-op then
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 1.4);
  std::vector<std::byte> out;
  REQUIRE(s.get(pid(1, 0), out) == dcr::get_status::found);
  CHECK(out == bytes);
  // Too few retries for the outage: a clear timeout error. The server stays stopped until the
  // store has given up (a thaw on a timer could answer a client that a loaded machine starved
  // past it: seen once in 5 repeats beside the tool suite).
  o.max_retries = 1;
  dcr::s3_payload_store impatient(o);
  freeze f;
  const auto t1 = std::chrono::steady_clock::now();
  const auto what = error_of([&] { (void)impatient.get(pid(1, 0), out); });
  const double gave_up = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  CHECK_MESSAGE(gave_up < 2.5, "gave up after " << gave_up << " s (2 attempts of 300 ms)");
  CHECK(what.find("timed out") != std::string::npos);
  CHECK(what.find("(after 2 attempts)") != std::string::npos);
}

// ---- an independent client

TEST_CASE("cross-check with boto3: it reads what the store put and the store reads what it put") {
  if (run("python3 -c 'import boto3' 2>/dev/null").first != 0) {
    if (!env("CI").empty()) FAIL("boto3 is not installed (pip install boto3; scripts/install-deps.sh)");
    MESSAGE("boto3 is not installed: cross-check skipped");
    return;
  }
  dcr::s3_payload_store s(options());
  const auto bytes = pattern(300000, 11);
  s.put(pid(3, 0), bytes);
  const std::string script = std::filesystem::temp_directory_path() / ("dcr-s3-check-" + std::to_string(::getpid()) + ".py");
  {
    std::ofstream py(script);
    py << "import boto3, hashlib, os, sys\n"
          "s3 = boto3.client('s3', endpoint_url=os.environ['DCR_S3_ENDPOINT'],\n"
          "                  region_name=os.environ['AWS_REGION'])\n"
          "b = os.environ['DCR_S3_BUCKET']\n"
          "body = s3.get_object(Bucket=b, Key=sys.argv[1])['Body'].read()\n"
          "print(len(body), hashlib.sha256(body).hexdigest())\n"
          "s3.put_object(Bucket=b, Key=sys.argv[2], Body=b'written by boto3 ' * 1000)\n";
  }
  const auto [status, out] = run("python3 " + script + " " + s.payload_key(pid(3, 0)) + " " + s.payload_key(pid(3, 1)));
  std::filesystem::remove(script);
  REQUIRE(status == 0);
  CHECK(out == std::to_string(bytes.size()) + " " + dcr::detail::s3::sha256_hex(bytes) + "\n");
  std::vector<std::byte> got;
  REQUIRE(s.get(pid(3, 1), got) == dcr::get_status::found);
  std::string expected;
  for (int i = 0; i < 1000; ++i) expected += "written by boto3 ";
  CHECK(got == bytes_of(expected));
  CHECK(s.list(dcr::attempt_key{1, 2, 0}).at(0).ids.size() == 2);
}

// ---- sources over S3

TEST_CASE("prefetch_source and fan-out over S3: every payload delivered once, each downloaded once") {
  dcr::s3_payload_store s(options());
  std::vector<dcr::payload_id> ids;
  for (std::uint32_t o : {10u, 20u}) {
    std::vector<dcr::payload_id> mine;
    for (std::uint32_t q = 0; q < 8; ++q) {
      mine.push_back(pid(o, q));
      s.put(mine.back(), pattern(50000 + q, o + q));
    }
    s.put_manifest(dcr::attempt_key{1, 2, 0}, o, mine);
    ids.insert(ids.end(), mine.begin(), mine.end());
  }
  const std::vector<std::uint32_t> owners{10, 20};
  auto drain = [&](auto& src) {
    src.open(dcr::attempt_key{1, 2, 0}, owners);
    std::multiset<dcr::payload_id> got;
    const auto deadline = dcr::protocol_clock::now() + 20s;
    for (;;) {
      dcr::delivery d;
      const auto st = src.next(d, deadline);
      if (st == dcr::source_status::complete) return got;
      REQUIRE(st == dcr::source_status::delivered);
      CHECK(d.bytes == pattern(50000 + d.id.sequence, d.id.owner + d.id.sequence));
      got.insert(d.id);
    }
  };
  {
    dcr::prefetch_source src(s, dcr::prefetch_options{4, 0, 5ms});
    CHECK(drain(src) == std::multiset<dcr::payload_id>(ids.begin(), ids.end()));
  }
  char tmpl[] = "/tmp/dcr-s3-fanout-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    dcr::s3_payload_store remote(options(s.prefix()));
    dcr::file_payload_store local(dir / "local");
    dcr::directory_claims claims(dir / "claims");
    using fan = dcr::fanout_store<dcr::s3_payload_store, dcr::file_payload_store>;
    fan n0(remote, local, claims, {0, 2, 500ms, dcr::fanout_check::none}),
        n1(remote, local, claims, {1, 2, 500ms, dcr::fanout_check::none});
    std::multiset<dcr::payload_id> g0, g1;
    {
      std::jthread t0([&] {
        dcr::prefetch_source src(n0, dcr::prefetch_options{2, 0, 5ms});
        g0 = drain(src);
      });
      dcr::prefetch_source src(n1, dcr::prefetch_options{2, 0, 5ms});
      g1 = drain(src);
    }
    CHECK(g0 == std::multiset<dcr::payload_id>(ids.begin(), ids.end()));
    CHECK(g1 == g0);
    CHECK(remote.stats().objects_got == ids.size());  // each crossed once
    CHECK(n0.stats().remote_gets + n1.stats().remote_gets == ids.size());
    CHECK(n0.stats().remote_gets >= 4);
    CHECK(n1.stats().remote_gets >= 4);
  }
  std::filesystem::remove_all(dir);
}

// ---- the real agents over S3

TEST_CASE("the agents refit over S3, bit-exact, through an owner killed mid-put and a receiver killed mid-apply") {
  dcr::s3_payload_store store(options());
  dcr::memory_control_plane base;
  dcr_test::cluster_options o;
  o.bucket_bytes = 16384;
  o.attempt_timeout = 20s;
  s3_cluster c(base, o, store);
  c.start();
  auto step = [&](double rate) {
    c.advance(rate);
    c.launch();
    return c.run(c.primary(), dcr_test::after(90s));
  };
  auto settle_and_verify = [&](std::uint64_t v) {
    const auto required = c.committed_receivers(v);
    REQUIRE(required.has_value());
    CHECK(c.settle(*required) == "");
    CHECK(c.verify(v, *required) == "");
    return *required;
  };
  auto r = step(0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  settle_and_verify(1);
  CHECK(store.stats().objects_put > 0);

  // Owner 0 dies after its first put of 1 -> 2 and is restarted at once: the attempt fails,
  // the overwrite retry commits.
  std::atomic<bool> owner_killed{false};
  c.on_put = [&](s3_cluster::owner_inc& inc, const dcr::attempt_record& a, std::uint64_t n) {
    if (inc.slot == 0 && a.kind == dcr::attempt_kind::refit && a.key.target_version == 2 && n == 1 &&
        !owner_killed.exchange(true))
      c.kill_owner(&inc, true);
  };
  r = step(0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(owner_killed);
  CHECK(r.summary.attempts.size() >= 2);
  settle_and_verify(2);
  c.on_put = nullptr;

  // Receiver 1 dies at its first apply of 2 -> 3 and is restarted: restored over S3, it joins.
  std::atomic<bool> receiver_killed{false};
  c.on_apply = [&](s3_cluster::receiver_inc& inc, const dcr::attempt_record& a, std::uint64_t n) {
    if (inc.rank == 1 && a.kind == dcr::attempt_kind::refit && a.key.target_version == 3 && n == 1 &&
        !receiver_killed.exchange(true))
      c.kill_receiver(&inc, true);
  };
  r = step(0.02);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(receiver_killed);
  settle_and_verify(3);
  c.on_apply = nullptr;
  r = step(0.05);
  REQUIRE_MESSAGE(r.own_commit(), r.describe());
  CHECK(settle_and_verify(4).size() == 4);
  // Committed transitions were erased from the bucket.
  CHECK(store.list(dcr::attempt_key{0, 1, 0}).empty());
  CHECK(store.list(dcr::attempt_key{2, 3, 0}).empty());
}

TEST_CASE("the agents with a wrong secret: every attempt fails with the 403, nothing commits") {
  auto bad = options();
  bad.credentials.secret_access_key = "wrong";
  dcr::s3_payload_store store(bad);
  dcr::memory_control_plane base;
  dcr_test::cluster_options o;
  o.max_attempts = 2;
  o.attempt_timeout = 5s;
  s3_cluster c(base, o, store);
  c.start();
  c.advance(0.02);
  c.launch();
  const auto r = c.run(c.primary(), dcr_test::after(30s));
  CHECK_FALSE(r.own_commit());
  CHECK(c.version() == 0);
  bool named = false;
  for (const auto& a : r.summary.attempts) {
    CHECK_FALSE(a.committed);
    named = named || a.failure.find("403 SignatureDoesNotMatch") != std::string::npos;
    for (const auto& rep : a.reports) named = named || rep.failure.find("403 SignatureDoesNotMatch") != std::string::npos;
  }
  CHECK_MESSAGE(named, r.describe());
  (void)c.settle({}, 1s);
}

int main(int argc, char** argv) {
  if (env("DCR_S3_ENDPOINT").empty() || env("DCR_S3_BUCKET").empty()) {
    std::fprintf(stderr, "test_s3: DCR_S3_ENDPOINT/DCR_S3_BUCKET not set (run through scripts/with-s3.sh)\n");
    return env("CI").empty() ? 77 : 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
