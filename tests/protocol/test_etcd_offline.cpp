// What the etcd control plane does without a server: base64 (detail/base64.hpp, the coding of
// every key and value on etcd's gateway), the etcd:// address syntax and its TLS and user options.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "dcr/detail/base64.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"

using dcr::detail::base64_decode;
using dcr::detail::base64_encode;

namespace {

/// parse_address refuses `address` as invalid_argument with a message naming it.
void check_address_refused(const std::string& address) {
  CAPTURE(address);
  try {
    (void)dcr::etcd_control_plane::parse_address(address);
    FAIL("accepted");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::invalid_argument);
    CHECK(std::string(e.what()).find(address) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("base64 matches RFC 4648's test vectors") {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},           {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    CHECK(base64_encode(plain) == coded);
    CHECK(base64_decode(coded) == std::optional<std::string>(plain));
  }
}

TEST_CASE("base64 round-trips every byte and random strings") {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  CHECK(base64_decode(base64_encode(all)) == all);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string s(rng() % 40, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    const auto e = base64_encode(s);
    CHECK(e.size() == (s.size() + 2) / 3 * 4);
    CHECK(base64_decode(e) == s);
  }
}

TEST_CASE("base64 decoding accepts the URL-safe alphabet and missing padding") {
  CHECK(base64_decode("-_8=") == std::string("\xfb\xff", 2));
  CHECK(base64_decode("+/8=") == std::string("\xfb\xff", 2));
  CHECK(base64_decode("Zm8") == std::string("fo"));
  CHECK(base64_decode("Zg") == std::string("f"));
}

TEST_CASE("base64 decoding rejects what is not base64") {
  CHECK_FALSE(base64_decode("Zm9v!").has_value());   // bad character
  CHECK_FALSE(base64_decode("Z").has_value());       // 1 mod 4
  CHECK_FALSE(base64_decode("Zm=v").has_value());    // padding inside
  CHECK_FALSE(base64_decode("Zh==").has_value());    // stray bits after the last byte
  CHECK_FALSE(base64_decode("Zm9=").has_value());    // stray bits
  CHECK_FALSE(base64_decode("Zm9v\n").has_value());  // whitespace
  CHECK_FALSE(base64_decode("====").has_value());
}

TEST_CASE("etcd addresses: endpoint and key prefix") {
  using dcr::etcd_control_plane;
  auto a = etcd_control_plane::parse_address("etcd://127.0.0.1:2379");
  CHECK(a.endpoint == "http://127.0.0.1:2379");
  CHECK(a.key_prefix == "/dcr");
  a = etcd_control_plane::parse_address("etcd://etcd-0.cluster.local:2379/team/run1/");
  CHECK(a.endpoint == "http://etcd-0.cluster.local:2379");
  CHECK(a.key_prefix == "/team/run1");
  a = etcd_control_plane::parse_address("etcd://[::1]:23790/x");
  CHECK(a.endpoint == "http://[::1]:23790");
  CHECK(a.key_prefix == "/x");
  a = etcd_control_plane::parse_address("etcds://etcd:2379");
  CHECK(a.endpoint == "https://etcd:2379");

  for (const char* bad : {"http://127.0.0.1:2379", "etcd://127.0.0.1", "etcd://:2379",
                          "etcd://h:0", "etcd://h:65536", "etcd://h:12x", "etcd://h:2379/",
                          "etcd://[::1/x", "etcd://[::1]/x", "etcd://u:p@h:1", "etcd://"}) {
    check_address_refused(bad);
  }
}

TEST_CASE("etcd control plane: endpoints and options are checked on construction") {
  CHECK_THROWS_AS(dcr::etcd_control_plane("127.0.0.1:2379"), dcr::error);
  dcr::etcd_options o;
  o.request_timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_AS(dcr::etcd_control_plane("http://127.0.0.1:2379", o), dcr::error);
  dcr::etcd_control_plane plane("http://127.0.0.1:2379/");  // connects lazily
  CHECK(plane.endpoint() == "http://127.0.0.1:2379");
  CHECK(plane.key_prefix().empty());
}

TEST_CASE("etcd addresses: TLS files, user and password file as options; clear refusals") {
  using dcr::etcd_control_plane;
  char tmpl[] = "/tmp/dcr-etcd-offline-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string pw = dir + "/pw";
  { std::FILE* f = std::fopen(pw.c_str(), "w"); std::fputs("s3cret-pass\r\nignored\n", f); std::fclose(f); }
  auto a = etcd_control_plane::parse_address("etcds://10.0.0.1:2379/run?ca=/c/ca.pem&cert=/c/me.pem&key=/c/me.key&user=dcr&password-file=" + pw);
  CHECK(a.endpoint == "https://10.0.0.1:2379");
  CHECK(a.key_prefix == "/run");
  CHECK(a.options.ca_file == "/c/ca.pem");
  CHECK(a.options.cert_file == "/c/me.pem");
  CHECK(a.options.key_file == "/c/me.key");
  CHECK(a.options.user == "dcr");
  CHECK(a.options.password == "s3cret-pass");
  ::setenv("DCR_ETCD_PASSWORD", "from-env", 1);
  a = etcd_control_plane::parse_address("etcd://h:1?user=dcr");
  CHECK(a.key_prefix == "/dcr");
  CHECK(a.options.password == "from-env");
  ::unsetenv("DCR_ETCD_PASSWORD");
  for (const std::string bad : {"etcd://h:1?", "etcd://h:1?ca", "etcd://h:1?ca=", "etcds://h:1?x=1",
                                "etcds://h:1?ca=a&ca=b", "etcd://h:1?ca=/ca.pem", "etcds://h:1?cert=/c.pem",
                                "etcds://h:1?password-file=/pw", "etcd://h:1?user=dcr",
                                "etcd://h:1?user=dcr&password-file=/nonexistent/pw"}) {
    check_address_refused(bad);
  }
  // The plane checks the same of options given directly, and never shows the password.
  dcr::etcd_options o;
  o.cert_file = pw;
  CHECK_THROWS_AS(dcr::etcd_control_plane("https://h:1", o), dcr::error);  // no key
  o.key_file = pw;
  CHECK_THROWS_AS(dcr::etcd_control_plane("http://h:1", o), dcr::error);  // TLS over http
  o.key_file = dir + "/missing.key";
  try {
    dcr::etcd_control_plane p("https://h:1", o);
    FAIL("accepted");
  } catch (const dcr::error& e) {
    CHECK(std::string(e.what()).find("missing.key") != std::string::npos);
  }
  dcr::etcd_options p;
  p.password = "hunter2";
  try {
    dcr::etcd_control_plane plane("http://h:1", p);
    FAIL("accepted");
  } catch (const dcr::error& e) {
    CHECK(std::string(e.what()).find("without a user") != std::string::npos);
    CHECK(std::string(e.what()).find("hunter2") == std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
