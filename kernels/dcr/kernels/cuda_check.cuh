// dcr/kernels/cuda_check.cuh: turning CUDA runtime errors into exceptions at the host API
// boundary (nvcc only).
//
// `DCR_CUDA_TRY(call)` evaluates a CUDA runtime call once and throws when it does not return
// cudaSuccess. The exception is a dcr::error with code errc::device_error naming the error, the
// call, and where it was made. Device code never throws: kernels report through their outputs,
// launchers check with DCR_CUDA_TRY.
#pragma once

#if !defined(__CUDACC__)
#error "dcr/kernels/cuda_check.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime_api.h>

#include <string>

#include "dcr/error.hpp"

namespace dcr::kernels::detail {

/// Throws for a failed CUDA runtime call; clears the (non-sticky) error state first, so the
/// next call on the thread does not report the same failure again.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();
  throw ::dcr::error(::dcr::errc::device_error,
                     std::string("dcr: CUDA error ") + cudaGetErrorName(status) + " (" +
                         cudaGetErrorString(status) + ") in `" + call + "` at " + file + ":" +
                         std::to_string(line));
}

}  // namespace dcr::kernels::detail

/// Evaluates the CUDA runtime call `call` and throws dcr::error(errc::device_error) unless it
/// succeeded.
#define DCR_CUDA_TRY(call)                                                                  \
  do {                                                                                      \
    const cudaError_t dcr_cuda_status_ = (call);                                            \
    if (dcr_cuda_status_ != cudaSuccess) [[unlikely]] {                                     \
      ::dcr::kernels::detail::throw_cuda_error(dcr_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)
