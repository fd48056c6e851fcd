// tests/exec/test_device.cpp: what dcr::exec reports of CUDA on this machine. The driver probe
// never throws and is consistent (a device count, or a reason there is none); the device names
// are the flag spellings. Choosing a device from `--device` is the tool's (tests/tool).
#include <doctest/doctest.h>

#include <string>

#include "dcr/exec/device.hpp"

namespace {

using dcr::exec::device_kind;

TEST_CASE("device names are the flag spellings") {
  CHECK(std::string(dcr::exec::device_name(device_kind::cpu)) == "cpu");
  CHECK(std::string(dcr::exec::device_name(device_kind::cuda)) == "cuda");
}

TEST_CASE("the CUDA probe reports a device, or why there is none") {
  const auto probe = dcr::exec::probe_cuda();
  CHECK(probe.devices >= 0);
  CHECK((probe.devices > 0) == probe.detail.empty());
  if (probe.devices > 0) CHECK(probe.driver);
  // Asking twice gives the same answer (the library is loaded and closed each time).
  const auto again = dcr::exec::probe_cuda();
  CHECK(again.devices == probe.devices);
  CHECK(again.detail == probe.detail);
}

}  // namespace
