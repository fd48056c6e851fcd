// tests/tool/test_device_choice.cpp: the tool's `--device` (tools/dcr/device_choice.hpp). cpu
// always runs; cuda runs only where the driver reports a device and the build has the CUDA
// backend, and otherwise fails with errc::device_error and a message saying that no CUDA device
// is present and why (or that the backend is missing).
#include <doctest/doctest.h>

#include <string>

#include "../error_capture.hpp"
#include "device_choice.hpp"

namespace {

using dcr::errc;
using dcr::exec::device_kind;

TEST_CASE("parse_device takes cpu and cuda, nothing else") {
  CHECK(dcr_tool::parse_device("cpu") == device_kind::cpu);
  CHECK(dcr_tool::parse_device("cuda") == device_kind::cuda);
  for (const char* bad : {"", "gpu", "CUDA", "cuda:0"}) {
    const auto call = [&] { (void)dcr_tool::parse_device(bad); };
    CHECK(dcr_test::code_of(call) == errc::invalid_argument);
    CHECK(dcr_test::message_of(call).find("unknown device") != std::string::npos);
  }
}

TEST_CASE("cpu is always selectable") {
  const auto s = dcr_tool::select_device(device_kind::cpu);
  CHECK(s.kind == device_kind::cpu);
  CHECK(s.description == "cpu");
}

TEST_CASE("cuda is selectable exactly when the driver reports a device") {
  const auto probe = dcr::exec::probe_cuda();
  for (bool backend : {false, true}) {
    CAPTURE(backend);
    if (probe.devices > 0 && backend) {
      const auto s = dcr_tool::select_device(device_kind::cuda, backend);
      CHECK(s.kind == device_kind::cuda);
      CHECK(s.description.rfind("cuda: ", 0) == 0);
      continue;
    }
    const auto call = [&] { (void)dcr_tool::select_device(device_kind::cuda, backend); };
    CHECK(dcr_test::code_of(call) == errc::device_error);
    const std::string message = dcr_test::message_of(call);
    if (probe.devices == 0) {
      CHECK(message.find("no CUDA device present") != std::string::npos);
      CHECK(message.find(probe.detail) != std::string::npos);
    } else {
      CHECK(message.find("no CUDA backend") != std::string::npos);
    }
  }
}

}  // namespace
