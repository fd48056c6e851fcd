// tests/error_capture.hpp: what a call throws, as a value, for assertions on error classes
// and messages. Shared by the test suites.
#pragma once

#include <string>

#include "dcr/error.hpp"

namespace dcr_test {

/// The dcr::errc a call throws, or errc::ok when it returns.
template <class F>
dcr::errc code_of(F&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return dcr::errc::ok;
}

/// The message of the dcr::error a call throws, or "" when it returns.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.what();
  }
  return {};
}

}  // namespace dcr_test
