// The etcd control plane against an etcd that requires TLS client certificates and
// authentication (scripts/with-etcd.sh --tls: https only, --client-cert-auth, users enabled,
// tokens expiring after 2 s without use): the control-plane laws over https with a client
// certificate and a user; a token that expired is renewed; a wrong client certificate, no
// certificate, a server outside the trusted CA and a wrong password are refused with clear
// errors; the etcds:// address with its options opens the same plane.
//
// Without DCR_ETCD_CA (with-etcd.sh without --tls, or not run through it) the test is skipped
// (exit 77), or fails when CI is set.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "control_plane_laws.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"
#include "service_test_support.hpp"

namespace {

using namespace std::chrono_literals;

using dcr_test::env;

// A key prefix no other test (nor an earlier run) has used.
std::string fresh_prefix() { return dcr_test::unique_prefix("/dcr-tls-test/"); }

// Everything right: the CA, the client certificate, the user.
dcr::etcd_options secured(std::string prefix = fresh_prefix()) {
  dcr::etcd_options o;
  o.key_prefix = std::move(prefix);
  o.ca_file = env("DCR_ETCD_CA");
  o.cert_file = env("DCR_ETCD_CERT");
  o.key_file = env("DCR_ETCD_KEY");
  o.user = env("DCR_ETCD_USER");
  o.password = env("DCR_ETCD_PASSWORD");
  return o;
}

template <class F>
std::string error_of(F&& f, dcr::errc code) {
  try {
    f();
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == code);
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

}  // namespace

TEST_CASE("etcd over TLS with a client certificate and a user keeps the control-plane laws") {
  const auto o = secured();
  dcr::etcd_control_plane a(env("DCR_ETCD_ENDPOINT"), o), b(env("DCR_ETCD_ENDPOINT"), o);
  dcr_test::check_control_plane_laws(a, b);
  CHECK(a.authentications() >= 1);
  // Leases and watches carry the token too.
  const auto lease = a.grant_lease(5s);
  CHECK(a.keep_alive(lease));
  const auto rev = a.revision();
  std::jthread writer([&] {
    std::this_thread::sleep_for(200ms);
    const dcr::key_write w{"/w", "x", lease, false};
    CHECK(b.transact({}, std::span(&w, 1)));
  });
  CHECK(a.wait_for_change("/w", rev, dcr::protocol_clock::now() + 5s) > rev);
  a.revoke(lease);
}

TEST_CASE("an expired token is renewed and the call goes through") {
  dcr::etcd_control_plane a(env("DCR_ETCD_ENDPOINT"), secured());
  const dcr::key_write w{"/k", "v1", 0, false};
  REQUIRE(a.transact({}, std::span(&w, 1)));
  REQUIRE(a.authentications() == 1);
  // etcd's --auth-token-ttl is 2 s here; it drops expired tokens once a second
  std::this_thread::sleep_for(4500ms);
  CHECK(a.get("/k")->value == "v1");
  CHECK(a.authentications() == 2);
  // A watch whose token expired is renewed as well.
  const auto rev = a.revision();
  std::this_thread::sleep_for(4500ms);
  std::jthread writer([&] {
    std::this_thread::sleep_for(300ms);
    dcr::etcd_control_plane b(env("DCR_ETCD_ENDPOINT"), secured(a.key_prefix()));
    const dcr::key_write w2{"/k", "v2", 0, false};
    CHECK(b.transact({}, std::span(&w2, 1)));
  });
  CHECK(a.wait_for_change("/k", rev, dcr::protocol_clock::now() + 5s) > rev);
  CHECK(a.authentications() == 3);
}

TEST_CASE("refused: a client certificate of another CA, none, an untrusted server, a wrong password") {
  const auto endpoint = env("DCR_ETCD_ENDPOINT");
  {
    auto o = secured();
    o.cert_file = env("DCR_ETCD_WRONG_CERT");
    o.key_file = env("DCR_ETCD_WRONG_KEY");
    o.request_timeout = 1000ms;
    dcr::etcd_control_plane p(endpoint, o);
    const auto what = error_of([&] { (void)p.get("/x"); }, dcr::errc::control_plane_unavailable);
    CHECK(what.find(endpoint) != std::string::npos);
    CHECK(p.authentications() == 0);
  }
  {
    auto o = secured();
    o.cert_file.clear();
    o.key_file.clear();
    o.request_timeout = 1000ms;
    dcr::etcd_control_plane p(endpoint, o);
    (void)error_of([&] { (void)p.get("/x"); }, dcr::errc::control_plane_unavailable);
  }
  {
    auto o = secured();
    o.ca_file = env("DCR_ETCD_WRONG_CERT");  // not the CA that signed etcd's certificate
    dcr::etcd_control_plane p(endpoint, o);
    const auto what = error_of([&] { (void)p.get("/x"); }, dcr::errc::control_plane_unavailable);
    CHECK_MESSAGE(what.find("certificate") != std::string::npos, what);
  }
  {
    auto o = secured();
    o.password = "not-the-password";
    dcr::etcd_control_plane p(endpoint, o);
    const auto what = error_of([&] { (void)p.get("/x"); }, dcr::errc::invalid_argument);
    CHECK_MESSAGE(what.find("authentication failed") != std::string::npos, what);
    CHECK(what.find("user " + o.user) != std::string::npos);
    CHECK(what.find("not-the-password") == std::string::npos);
  }
  {
    // Without a user, etcd refuses every call (authentication is on).
    auto o = secured();
    o.user.clear();
    o.password.clear();
    dcr::etcd_control_plane p(endpoint, o);
    CHECK(error_of([&] { (void)p.get("/x"); }, dcr::errc::invalid_argument).find("user name is empty") !=
          std::string::npos);
  }
}

TEST_CASE("the etcds:// address carries the CA, the client certificate and the user") {
  const auto endpoint = env("DCR_ETCD_ENDPOINT");
  const std::string hostport = endpoint.substr(std::string("https://").size());
  const auto prefix = fresh_prefix();
  char tmpl[] = "/tmp/dcr-etcd-pw-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const auto pw = env("DCR_ETCD_PASSWORD") + "\n";
  REQUIRE(::write(fd, pw.data(), pw.size()) == static_cast<ssize_t>(pw.size()));
  ::close(fd);
  const std::string address = "etcds://" + hostport + prefix + "?ca=" + env("DCR_ETCD_CA") +
                              "&cert=" + env("DCR_ETCD_CERT") + "&key=" + env("DCR_ETCD_KEY") +
                              "&user=" + env("DCR_ETCD_USER") + "&password-file=" + tmpl;
  auto plane = dcr::etcd_control_plane::open(address);
  CHECK(plane.key_prefix() == prefix);
  const dcr::key_write w{"/a", "1", 0, false};
  REQUIRE(plane.transact({}, std::span(&w, 1)));
  dcr::etcd_control_plane check(endpoint, secured(prefix));
  CHECK(check.get("/a")->value == "1");
  ::unlink(tmpl);
}

int main(int argc, char** argv) {
  if (env("DCR_ETCD_ENDPOINT").empty() || env("DCR_ETCD_CA").empty()) {
    std::fprintf(stderr, "test_etcd_tls: DCR_ETCD_CA is not set (run through scripts/with-etcd.sh --tls)\n");
    return env("CI").empty() ? 77 : 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
