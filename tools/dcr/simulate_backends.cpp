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

class cpu_storage_backend final : public device_storage_backend {
 public:
  explicit cpu_storage_backend(const std::vector<ex::storage_region>& regions)
      : inner_(ex::cpu, regions, "cpu-exec") {}
  [[nodiscard]] std::string device() const override { return inner_.device(); }
  void prepare(const dcr::placement_plan& plan) override { inner_.prepare(plan); }
  std::uint64_t apply(const dcr::item& it) override { return inner_.apply(it); }
  void upload_storage() override { inner_.upload_storage(); }
  void download_storage() override { inner_.download_storage(); }

 private:
  ex::policy_apply_backend<ex::cpu_policy> inner_;
};

}  // namespace

std::unique_ptr<dcr::detect_backend> make_detect_backend(dcr::exec::device_kind device, int id) {
  if (device == dcr::exec::device_kind::cuda) return make_cuda_detect_backend(id);
  if (cpu_backends_requested())
    return std::make_unique<ex::policy_detect_backend<ex::cpu_policy>>(ex::cpu, "cpu-exec");
  return nullptr;
}

std::unique_ptr<device_storage_backend> make_apply_backend(
    dcr::exec::device_kind device, std::span<const std::span<std::byte>> buffers, int id) {
  if (device == dcr::exec::device_kind::cuda) return make_cuda_apply_backend(buffers, id);
  if (!cpu_backends_requested()) return nullptr;
  std::vector<ex::storage_region> regions;
  for (const auto& b : buffers) regions.push_back({b.data(), b.size()});
  return std::make_unique<cpu_storage_backend>(regions);
}

}  // namespace dcr_tool
