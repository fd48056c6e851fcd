// tools/dcr/simulate_cuda_stub.cpp: simulate_cuda.hpp in a build without nvcc: no CUDA backend.
// `dcr simulate --device cuda` stops at dcr_tool::select_device before any of these is called;
// they throw the same error should anything else reach them.
#include "simulate_cuda.hpp"

#include "dcr/error.hpp"

namespace dcr_tool {
namespace {
[[noreturn]] void no_backend() {
  throw dcr::error(dcr::errc::device_error,
                   "--device cuda: this build has no CUDA backend (configure with -Dcuda=enabled "
                   "and nvcc on PATH); run with --device cpu");
}
}  // namespace

std::unique_ptr<dcr::mirrored_detect_backend> make_cuda_detect_backend(int) { no_backend(); }
std::unique_ptr<dcr::mirrored_apply_backend> make_cuda_apply_backend(
    std::span<const std::span<std::byte>>, int) {
  no_backend();
}
std::string cuda_device_of(int) { no_backend(); }

}  // namespace dcr_tool
