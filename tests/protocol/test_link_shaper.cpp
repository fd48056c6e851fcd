// The shaped link: rate parsing, the lower bound on time a booking imposes (never less; upper
// bounds are the benchmarks' business), and one flow shared by two processes.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "dcr/protocol/link_shaper.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("link rates parse with byte and bit units, and bad ones name the text") {
  CHECK(dcr::parse_link_rate("20MB/s") == doctest::Approx(20e6));
  CHECK(dcr::parse_link_rate("100MiB/s") == doctest::Approx(100.0 * 1048576));
  CHECK(dcr::parse_link_rate("5Gbps") == doctest::Approx(625e6));
  CHECK(dcr::parse_link_rate("1.5 kB/s") == doctest::Approx(1500));
  CHECK(dcr::parse_link_rate("0") == 0);
  CHECK(dcr::parse_link_rate("unlimited") == 0);
  for (const char* bad : {"", "fast", "20", "20MB", "-1MB/s", "20 parsecs", "nanMB/s"}) {
    CAPTURE(bad);
    try {
      (void)dcr::parse_link_rate(bad);
      FAIL("accepted a bad rate");
    } catch (const dcr::error& e) {
      CHECK(e.dcr_code() == dcr::errc::invalid_argument);
      CHECK(std::string(e.what()).find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
}

TEST_CASE("a shaped link holds a sender to its rate beyond the burst, and counts busy time") {
  dcr::link_shaper link(4e6, 64 * 1024);  // 4 MB/s
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 16; ++i) link.consume(64 * 1024);  // 1 MiB
  CHECK(seconds_since(t0) >= (1048576.0 - 65536) / 4e6 - 1e-3);
  CHECK(link.bytes() == 1048576);
  CHECK(link.busy_seconds() == doctest::Approx(1048576.0 / 4e6).epsilon(1e-6));

  dcr::link_shaper unlimited(0);
  unlimited.consume(1ull << 40);  // returns at once, still counted
  CHECK(unlimited.bytes() == 1ull << 40);
  CHECK(unlimited.busy_seconds() == 0);
}

TEST_CASE("two processes on one shared link share its rate") {
  const auto file = std::filesystem::temp_directory_path() /
                    ("dcr-link-test-" + std::to_string(::getpid()));
  std::filesystem::remove(file);
  const double rate = 4e6, burst = 64 * 1024;
  auto send_half = [&] {
    auto link = dcr::link_shaper::shared(file, rate, burst);
    for (int i = 0; i < 8; ++i) link.consume(64 * 1024);  // 512 KiB each
  };
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    send_half();
    std::_Exit(0);
  }
  send_half();
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(seconds_since(t0) >= (1048576.0 - 2 * burst) / rate - 1e-3);
  auto link = dcr::link_shaper::shared(file, rate, burst);
  CHECK(link.bytes() == 1048576);
  CHECK(link.local_bytes() == 0);  // this handle booked nothing itself
  CHECK(link.busy_seconds() == doctest::Approx(1048576.0 / rate).epsilon(1e-6));
  std::filesystem::remove(file);
}
