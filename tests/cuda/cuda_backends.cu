// tests/cuda/cuda_backends.cu: cuda_backends.hpp with the CUDA policy (nvcc only): the policy-
// generic backends of dcr/exec/refit.hpp instantiated with dcr::exec::cuda_policy.
#include "cuda_backends.hpp"

#include <cuda_runtime_api.h>

#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"
#include "dcr/exec/refit.hpp"

namespace dcr_test {
namespace {

namespace ex = dcr::exec;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class device_detect final : public cuda_detect_backend {
 public:
  explicit device_detect(const ex::cuda_policy& policy) : inner_(policy, "cuda") {}
  [[nodiscard]] std::string device() const override { return inner_.device(); }
  void initialize(std::span<const dcr::affine_task> tasks,
                  std::span<const std::span<const std::byte>> committed) override {
    inner_.initialize(tasks, committed);
  }
  void detect(std::size_t task, std::span<const std::byte> candidate,
              std::vector<std::uint64_t>& changed, dcr::projected_changes& projected) override {
    inner_.detect(task, candidate, changed, projected);
  }
  void commit(std::size_t task, std::span<const std::byte> candidate,
              std::span<const std::uint64_t> changed, bool dense) override {
    inner_.commit(task, candidate, changed, dense);
  }
  [[nodiscard]] std::vector<std::byte> tracker(std::size_t task) override {
    return inner_.tracker(task);
  }

 private:
  ex::policy_detect_backend<ex::cuda_policy> inner_;
};

std::vector<ex::storage_region> regions_of(std::span<const std::span<std::byte>> buffers) {
  std::vector<ex::storage_region> out;
  for (const auto& b : buffers) out.push_back({b.data(), b.size()});
  return out;
}

class device_apply final : public cuda_apply_backend {
 public:
  device_apply(const ex::cuda_policy& policy, std::span<const std::span<std::byte>> buffers)
      : inner_(policy, regions_of(buffers), "cuda") {}
  [[nodiscard]] std::string device() const override { return inner_.device(); }
  void prepare(const dcr::placement_plan& plan) override { inner_.prepare(plan); }
  std::uint64_t apply(const dcr::item& it) override { return inner_.apply(it); }
  void upload_storage() override { inner_.upload_storage(); }
  void download_storage() override { inner_.download_storage(); }

 private:
  ex::policy_apply_backend<ex::cuda_policy> inner_;
};

}  // namespace

cuda_session::cuda_session() {
  DCR_CUDA_TRY(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  DCR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
}

cuda_session::~cuda_session() {
  (void)cudaStreamSynchronize(as_stream(stream_));
  (void)cudaStreamDestroy(as_stream(stream_));
}

std::unique_ptr<cuda_detect_backend> cuda_session::make_detect() const {
  return std::make_unique<device_detect>(ex::cuda_policy{}.on(as_stream(stream_)));
}

std::unique_ptr<cuda_apply_backend> cuda_session::make_apply(
    std::span<const std::span<std::byte>> buffers) const {
  return std::make_unique<device_apply>(ex::cuda_policy{}.on(as_stream(stream_)), buffers);
}

void cuda_session::synchronize() const { DCR_CUDA_TRY(cudaStreamSynchronize(as_stream(stream_))); }

bool cuda_device_present(std::string& why) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    why = cudaGetErrorString(status);
    return false;
  }
  if (devices == 0) {
    why = "device count is 0";
    return false;
  }
  return true;
}

}  // namespace dcr_test
