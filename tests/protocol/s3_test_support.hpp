// tests/protocol/s3_test_support.hpp: helpers shared by the S3 tests (offline and online).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/error.hpp"

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

}  // namespace dcr_test
