// What the etcd control plane does without a server: base64 (detail/base64.hpp, the coding of
// every key and value on etcd's gateway) and the etcd:// address syntax.
#include <doctest/doctest.h>

#include <random>

#include "dcr/detail/base64.hpp"
#include "dcr/protocol/etcd_control_plane.hpp"

using dcr::detail::base64_decode;
using dcr::detail::base64_encode;

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
    CAPTURE(bad);
    try {
      (void)etcd_control_plane::parse_address(bad);
      FAIL("accepted");
    } catch (const dcr::error& e) {
      CHECK(e.dcr_code() == dcr::errc::invalid_argument);
      CHECK(std::string(e.what()).find(bad) != std::string::npos);
    }
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
