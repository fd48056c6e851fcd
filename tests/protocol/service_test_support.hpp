// tests/protocol/service_test_support.hpp: what the tests against real servers (etcd, S3)
// share: the environment scripts/with-etcd.sh and scripts/with-s3.sh set, and key prefixes no
// other test (nor an earlier run on the same server) has used.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

namespace dcr_test {

/// The variable `name` of the environment, or "" when unset.
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

/// stem + "<pid>-<time>-<n>" + tail: unique to this call, this process and this moment.
inline std::string unique_prefix(std::string_view stem, std::string_view tail = "") {
  static std::atomic<int> n{0};
  return std::string(stem) + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "-" +
         std::to_string(n++) + std::string(tail);
}

}  // namespace dcr_test
