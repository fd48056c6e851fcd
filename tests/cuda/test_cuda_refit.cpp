// tests/cuda/test_cuda_refit.cpp: the owner's detect stage and the receiver's apply stage on the
// GPU, exactly as `dcr simulate --device cuda` runs them (the tool's CUDA backends,
// tools/dcr/simulate_cuda.cu: dcr/exec/refit.hpp with dcr::exec::cuda_policy), against
// deployments without backends: the refit sweep of tests/random_deployment.hpp (whole refits
// through the protocol's agents on random trainer and engine layouts, a retry included) must
// send the same payloads, end bit for bit equal to a dense refit, and keep the device trackers
// equal to the owners'. The same sweep on the CPU policy: tests/exec/test_refit_backends.cpp.
// Exit 0 = pass, 1 = fail, 77 = skip (no CUDA device).
//
// A host C++ unit: only the tool's backends (simulate_cuda.cu, linked) went through nvcc.
#include <cstdio>
#include <exception>
#include <memory>
#include <span>

#include "../random_deployment.hpp"
#include "dcr/exec/device.hpp"
#include "simulate_cuda.hpp"

int main() {
  const auto probe = dcr::exec::probe_cuda();
  if (probe.devices == 0) {
    std::printf("no CUDA device: skipping (%s)\n", probe.detail.c_str());
    return 77;
  }
  int failures = 0;
  try {
    for (int seed = 1; seed <= 8; ++seed) {
      const auto problems =
          dcr_test::refits_with_backends_differ(seed, [](dcr::sim::in_process_deployment& d) {
            return dcr_test::installed_backends(
                d, [] { return dcr_tool::make_cuda_detect_backend(0); },
                [](std::span<const std::span<std::byte>> buffers) {
                  return dcr_tool::make_cuda_apply_backend(buffers, 0);
                });
          });
      for (const auto& p : problems) std::fprintf(stderr, "FAIL: %s\n", p.c_str());
      failures += static_cast<int>(problems.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("cuda refit backends: bit-exact\n");
  return 0;
}
