// The S3 payload store's bounds and the fan-out's check against a real S3 server (SeaweedFS,
// started by scripts/with-s3.sh) behind a misbehaving proxy (http_fault_proxy.hpp): a trickling
// answer is cut at the minimum rate; a Content-Length above the cap is refused at once; lying
// lengths, truncated bodies and a 500 are retried; gets end when cancelled or late; a corrupted
// download is never shared by the fan-out, which downloads again; https against the server's
// certificate, refused under another CA; the session token sent as x-amz-security-token.
//
// Without DCR_S3_ENDPOINT the test is skipped (exit 77), or fails when CI is set.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "dcr/protocol/store/fanout_store.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "http_fault_proxy.hpp"
#include "s3_test_support.hpp"
#include "service_test_support.hpp"

namespace {

using namespace std::chrono_literals;
using dcr_test::env;
using dcr_test::error_of;
using dcr_test::pattern;
using dcr_test::payload_of;
using fault = dcr_test::fault_proxy::fault;

// A key prefix no other test (nor an earlier run) has used.
std::string fresh_prefix() { return dcr_test::unique_prefix("faults-", "/"); }

int upstream_port() {
  const auto e = env("DCR_S3_ENDPOINT");
  return std::stoi(e.substr(e.rfind(':') + 1));
}

dcr::s3_options options(std::string prefix = fresh_prefix()) {
  return dcr_test::server_options(std::move(prefix), 100ms);
}

const dcr::payload_id id0{{1, 2, 0}, 1, 0};

// A store under a fresh prefix holding `bytes` as id0, and the same options pointed at a proxy.
struct proxied {
  dcr::s3_options direct = options();
  dcr::s3_payload_store origin{direct};
  dcr_test::fault_proxy proxy;
  dcr::s3_options via;
  proxied(std::span<const std::byte> bytes, std::vector<fault> script)
      : proxy(upstream_port(), "GET /" + direct.bucket + "/" + origin.payload_key(id0), std::move(script)) {
    origin.put(id0, bytes);
    via = direct;
    via.endpoint = proxy.endpoint();
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a trickling answer is cut at the minimum rate and retried; it never holds a get for long") {
  const auto bytes = pattern(4000, 1);
  {
    proxied p(bytes, {fault::trickle});
    p.via.stall_timeout = 1s;  // min_rate stays the default
    dcr::s3_payload_store s(p.via);
    std::vector<std::byte> out;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(s.get(id0, out) == dcr::get_status::found);
    const double took = seconds_since(t0);
    CHECK(out == bytes);
    CHECK(p.proxy.matched() == 2);
    CHECK_MESSAGE(took < 4.0, "the trickle held the get for " << took << " s");
  }
  {
    proxied p(bytes, {fault::trickle, fault::trickle});
    p.via.stall_timeout = 1s;
    p.via.max_retries = 1;
    dcr::s3_payload_store s(p.via);
    std::vector<std::byte> out;
    const auto t0 = std::chrono::steady_clock::now();
    const auto what = error_of([&] { (void)s.get(id0, out); });
    CHECK(seconds_since(t0) < 5.0);
    CHECK_MESSAGE(what.find("(after 2 attempts)") != std::string::npos, what);
    CHECK(out.empty());
  }
}

TEST_CASE("a Content-Length above the cap is refused at once and not retried") {
  const auto bytes = pattern(4000, 2);
  proxied p(bytes, {fault::huge_length, fault::huge_length});
  p.via.max_object_size = 1 << 20;
  dcr::s3_payload_store s(p.via);
  std::vector<std::byte> out;
  const auto t0 = std::chrono::steady_clock::now();
  const auto what = error_of([&] { (void)s.get(id0, out); });
  CHECK(seconds_since(t0) < 2.0);
  CHECK_MESSAGE(what.find("exceeds the cap of 1048576 bytes (Content-Length 1099511627776)") != std::string::npos,
                what);
  CHECK(p.proxy.matched() == 1);
  CHECK(out.empty());
  // The caller's cap (get_control::max_bytes) is as binding, for an honest answer too.
  proxied q(bytes, {});
  dcr::s3_payload_store t(q.via);
  dcr::get_control c;
  c.max_bytes = 1000;
  CHECK(error_of([&] { (void)t.get(id0, out, c); }).find("exceeds the cap of 1000 bytes") != std::string::npos);
  c.max_bytes = 4000;
  REQUIRE(t.get(id0, out, c) == dcr::get_status::found);
  CHECK(out == bytes);
}

TEST_CASE("a lying Content-Length, a truncated body and a 500 are retried until the real answer") {
  const auto bytes = pattern(50000, 3);
  proxied p(bytes, {fault::lie_length, fault::truncate, fault::status500});
  dcr::s3_payload_store s(p.via);
  std::vector<std::byte> out;
  REQUIRE(s.get(id0, out) == dcr::get_status::found);
  CHECK(out == bytes);
  CHECK(p.proxy.matched() == 4);
}

TEST_CASE("a get ends when its cancellation flag is set or its deadline passes, also mid-transfer") {
  const auto bytes = pattern(4000, 4);
  {
    proxied p(bytes, {fault::trickle});
    dcr::s3_payload_store s(p.via);  // default stall limit (30 s): only the flag can end it early
    std::atomic<bool> cancel{false};
    std::jthread canceller([&] {
      std::this_thread::sleep_for(300ms);
      cancel = true;
    });
    dcr::get_control c;
    c.cancel = &cancel;
    std::vector<std::byte> out;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(error_of([&] { (void)s.get(id0, out, c); }).find("cancelled") != std::string::npos);
    CHECK(seconds_since(t0) < 3.0);  // libcurl's progress callback runs at least once a second
    CHECK(out.empty());
  }
  {
    proxied p(bytes, {fault::trickle});
    dcr::s3_payload_store s(p.via);
    dcr::get_control c;
    c.deadline = dcr::protocol_clock::now() + 500ms;
    std::vector<std::byte> out;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(error_of([&] { (void)s.get(id0, out, c); }, dcr::errc::deadline_exceeded).find("deadline passed") !=
          std::string::npos);
    CHECK(seconds_since(t0) < 3.0);
  }
  {
    // A source: next() keeps its deadline while the get trickles, close() ends the get.
    proxied p(bytes, {fault::trickle});
    dcr::s3_payload_store s(p.via);
    p.origin.put_manifest(id0.attempt, 1, std::vector<dcr::payload_id>{id0});
    dcr::prefetch_source<dcr::s3_payload_store> src(s, dcr::prefetch_options{1, 0, 5ms});
    src.open(id0.attempt, std::vector<std::uint32_t>{1});
    dcr::delivery d;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(src.next(d, dcr::protocol_clock::now() + 300ms) == dcr::source_status::timed_out);
    CHECK(seconds_since(t0) < 1.5);
    const auto t1 = std::chrono::steady_clock::now();
    src.close(id0.attempt);
    CHECK(p.proxy.matched() == 1);
    (void)t1;
  }  // the destructor joins the worker: quick, since its get was cancelled
}

TEST_CASE("fan-out over S3: a corrupted download is not shared; it is downloaded again, and a refetch too") {
  const auto bytes = payload_of(id0);
  proxied p(bytes, {fault::corrupt});
  char tmpl[] = "/tmp/dcr-s3-faults-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    dcr::s3_payload_store remote(p.via);
    dcr::file_payload_store local(dir / "local");
    dcr::directory_claims claims(dir / "claims");
    dcr::fanout_store<dcr::s3_payload_store, dcr::file_payload_store> node(remote, local, claims, {0, 1, 500ms});
    std::vector<std::byte> out, shared;
    REQUIRE(node.get(id0, out) == dcr::get_status::found);
    CHECK(out == bytes);
    CHECK(node.stats().rejected == 1);
    CHECK(p.proxy.matched() == 2);
    REQUIRE(local.get(id0, shared) == dcr::get_status::found);
    CHECK(shared == bytes);  // what every receiver of the node reads
    dcr::prefetch_source<decltype(node)> src(node, dcr::prefetch_options{1, 0, 5ms});
    src.open(id0.attempt, std::vector<std::uint32_t>{1});
    REQUIRE(src.refetch(id0, out));
    CHECK(p.proxy.matched() == 3);  // downloaded again, not the shared copy
    CHECK(out == bytes);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("https: verified against the CA bundle (option or AWS_CA_BUNDLE); another CA is refused") {
  const auto https = env("DCR_S3_HTTPS_ENDPOINT");
  if (https.empty()) FAIL("DCR_S3_HTTPS_ENDPOINT is not set (scripts/with-s3.sh sets it)");
  auto o = options();
  o.endpoint = https;
  o.ca_file = env("DCR_S3_CA_FILE");
  o.payload_hash = dcr::s3_payload_hash::unsigned_payload;  // TLS protects the body
  dcr::s3_payload_store s(o);
  const auto bytes = pattern(70000, 5);
  s.put(id0, bytes);
  std::vector<std::byte> out;
  REQUIRE(s.get(id0, out) == dcr::get_status::found);
  CHECK(out == bytes);
  // The same through from_environment, which reads AWS_CA_BUNDLE.
  ::setenv("AWS_CA_BUNDLE", o.ca_file.c_str(), 1);
  auto e = dcr::s3_options::from_environment("s3://" + o.bucket + "/" + o.prefix, https);
  ::unsetenv("AWS_CA_BUNDLE");
  CHECK(e.ca_file == o.ca_file);
  dcr::s3_payload_store from_env(e);
  REQUIRE(from_env.get(id0, out) == dcr::get_status::found);
  CHECK(out == bytes);
  // A CA that did not sign the server's certificate: refused at once (no retry), nothing read.
  auto wrong = o;
  wrong.ca_file = env("DCR_S3_OTHER_CA_FILE");
  dcr::s3_payload_store w(wrong);
  const auto t0 = std::chrono::steady_clock::now();
  const auto what = error_of([&] { (void)w.get(id0, out); });
  CHECK(seconds_since(t0) < 2.0);
  CHECK_MESSAGE(what.find("certificate") != std::string::npos, what);
  CHECK(what.find("attempts") == std::string::npos);
  CHECK(what.find(o.credentials.secret_access_key) == std::string::npos);
}

TEST_CASE("a session token is sent as x-amz-security-token, and never in a message") {
  proxied p(pattern(10, 6), {});
  auto o = p.via;
  o.credentials.session_token = "session-token-123";
  dcr::s3_payload_store s(o);
  std::vector<std::byte> out;
  try {
    (void)s.get(id0, out);  // SeaweedFS may refuse a token it did not issue; the header is the point
  } catch (const dcr::error& e) {
    CHECK(std::string(e.what()).find("session-token-123") == std::string::npos);
  }
  const auto heads = p.proxy.heads();
  REQUIRE_FALSE(heads.empty());
  CHECK(heads.back().find("x-amz-security-token: session-token-123") != std::string::npos);
}

int main(int argc, char** argv) {
  if (env("DCR_S3_ENDPOINT").empty() || env("DCR_S3_BUCKET").empty()) {
    std::fprintf(stderr, "test_s3_faults: DCR_S3_ENDPOINT/DCR_S3_BUCKET not set (run through scripts/with-s3.sh)\n");
    return env("CI").empty() ? 77 : 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
