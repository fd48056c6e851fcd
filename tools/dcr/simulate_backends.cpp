// tools/dcr/simulate_backends.cpp: see simulate_backends.hpp.
#include "simulate_backends.hpp"

#include <cstdlib>
#include <string>
#include <vector>

#include "dcr/exec/refit.hpp"
#include "simulate_cuda.hpp"

namespace dcr_tool {
namespace {

namespace ex = dcr::exec;

bool cpu_backends_requested() {
  const char* v = std::getenv("DCR_SIMULATE_CPU_BACKENDS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace

std::unique_ptr<dcr::mirrored_detect_backend> make_detect_backend(dcr::exec::device_kind device,
                                                                 int id) {
  if (device == dcr::exec::device_kind::cuda) return make_cuda_detect_backend(id);
  if (cpu_backends_requested())
    return std::make_unique<ex::policy_detect_backend<ex::cpu_policy>>(ex::cpu, "cpu-exec");
  return nullptr;
}

std::unique_ptr<dcr::mirrored_apply_backend> make_apply_backend(
    dcr::exec::device_kind device, std::span<const std::span<std::byte>> buffers, int id) {
  if (device == dcr::exec::device_kind::cuda) return make_cuda_apply_backend(buffers, id);
  if (!cpu_backends_requested()) return nullptr;
  return std::make_unique<ex::policy_apply_backend<ex::cpu_policy>>(ex::cpu, ex::storage_regions(buffers),
                                                                    "cpu-exec");
}

}  // namespace dcr_tool
