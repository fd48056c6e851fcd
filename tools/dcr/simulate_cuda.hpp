// tools/dcr/simulate_cuda.hpp: the CUDA side of `dcr simulate --device cuda`, behind plain C++
// types. simulate_cuda.cu (nvcc, meson option `cuda`) builds the policy-generic backends of
// dcr/exec/refit.hpp with the CUDA policy; simulate_cuda_stub.cpp stands in where nvcc is absent
// (every factory throws errc::device_error, and select_device refuses `--device cuda` earlier).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "dcr/refit/detect_backend.hpp"
#include "simulate_backends.hpp"

namespace dcr_tool {

/// An owner's detect stage (detect + compact, projection, tracker update) on CUDA device
/// `process_id` modulo the device count, on a stream of its own.
std::unique_ptr<dcr::mirrored_detect_backend> make_cuda_detect_backend(int process_id);

/// A receiver's compiled-path apply on CUDA device `process_id` modulo the device count, into
/// a device copy of `buffers` (the engine storage's host buffers; call upload_storage() once
/// they hold what the device should start from).
std::unique_ptr<dcr::mirrored_apply_backend> make_cuda_apply_backend(
    std::span<const std::span<std::byte>> buffers, int process_id);

/// "NVIDIA H200 (device 0 of 1)": the device a backend of `process_id` runs on.
std::string cuda_device_of(int process_id);

}  // namespace dcr_tool
