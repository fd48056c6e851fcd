// tests/cuda/cuda_test.hpp: the frame of a CUDA test program: exit 0 = pass, 1 = fail,
// 77 = skip (no CUDA device), which meson test reports as SKIP.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <string>

namespace dcr_test {

inline int& cuda_failures() {
  static int failures = 0;
  return failures;
}

/// Records a failed check (the test goes on, and exits 1 at the end).
inline void check(bool ok, const std::string& what) {
  if (!ok) {
    ++cuda_failures();
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

/// Runs `body` when a CUDA device is present; returns the exit status.
template <class Body>
int run_cuda_test(const char* passed, Body&& body) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipping (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return 77;
  }
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  if (cuda_failures() != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", cuda_failures());
    return 1;
  }
  std::printf("%s\n", passed);
  return 0;
}

}  // namespace dcr_test
