// tests/protocol/s3_test_support.hpp: helpers shared by the S3 tests (offline, online, faults).
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/error.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "service_test_support.hpp"

namespace dcr_test {

/// Runs `f`, requires it to throw a dcr::error with `code`, returns the message.
template <class F>
std::string error_of(F&& f, dcr::errc code = dcr::errc::transport_failure) {
  try {
    f();
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == code);
    return e.what();
  }
  FAIL("no dcr::error was thrown");
  return {};
}

/// The bytes of `s`.
inline std::vector<std::byte> bytes_of(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

/// `n` pseudo-random bytes from `seed` (xorshift), the same for the same seed.
inline std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> out(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return out;
}

/// The options of the S3 server scripts/with-s3.sh started (DCR_S3_ENDPOINT, DCR_S3_BUCKET, the
/// region and credentials of the environment) under key prefix `prefix`, with short backoffs.
inline dcr::s3_options server_options(std::string prefix, std::chrono::milliseconds backoff_max) {
  dcr::s3_options o;
  o.endpoint = env("DCR_S3_ENDPOINT");
  o.bucket = env("DCR_S3_BUCKET");
  o.prefix = std::move(prefix);
  o.region = dcr::s3_region_from_environment();
  o.credentials = dcr::s3_credentials::from_environment();
  o.backoff_initial = std::chrono::milliseconds(20);
  o.backoff_max = backoff_max;
  return o;
}

/// A valid payload (no items) carrying `id` in its header (what a store's checks accept).
inline std::vector<std::byte> payload_of(const dcr::payload_id& id) {
  const dcr::tensor_registry registry;
  dcr::payload_header h;
  h.id = id;
  h.registry_fingerprint = registry.fingerprint();
  std::vector<std::byte> out;
  dcr::payload_encoder().encode(h, {}, registry, out);
  return out;
}

}  // namespace dcr_test
