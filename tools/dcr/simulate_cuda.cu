// tools/dcr/simulate_cuda.cu: simulate_cuda.hpp with the CUDA policy (nvcc only). The backends
// are dcr/exec/refit.hpp's, written once over the execution policy (tests/exec checks them on
// the CPU policy); this file only picks the device, makes a stream and instantiates them with
// dcr::exec::cuda_policy (kernels/dcr/kernels/exec.cuh).
#include "simulate_cuda.hpp"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"
#include "dcr/exec/refit.hpp"

namespace dcr_tool {
namespace {

namespace ex = dcr::exec;

int device_for(int process_id) {
  int devices = 0;
  DCR_CUDA_TRY(cudaGetDeviceCount(&devices));
  DCR_EXPECTS(devices > 0, dcr::errc::device_error, "--device cuda: no CUDA device present");
  return (process_id < 0 ? 0 : process_id) % devices;
}

/// The device of a process, made current, and a stream on it (destroyed last: the backends
/// free their buffers stream-ordered on it).
class device_stream {
 public:
  explicit device_stream(int process_id) : device_(device_for(process_id)) {
    DCR_CUDA_TRY(cudaSetDevice(device_));
    DCR_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~device_stream() {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  device_stream(const device_stream&) = delete;
  device_stream& operator=(const device_stream&) = delete;
  [[nodiscard]] ex::cuda_policy policy() const { return ex::cuda_policy{}.on(stream_); }
  /// Makes the device current on the calling thread (the agents may call from several).
  const device_stream& activate() const {
    DCR_CUDA_TRY(cudaSetDevice(device_));
    return *this;
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

class cuda_detect final : public dcr::mirrored_detect_backend {
 public:
  explicit cuda_detect(int process_id) : stream_(process_id), inner_(stream_.policy(), "cuda") {}
  [[nodiscard]] std::string device() const override { return inner_.device(); }
  void initialize(std::span<const dcr::affine_task> tasks,
                  std::span<const std::span<const std::byte>> committed) override {
    stream_.activate();
    inner_.initialize(tasks, committed);
  }
  void detect(std::size_t task, std::span<const std::byte> candidate,
              std::vector<std::uint64_t>& changed, dcr::projected_changes& projected) override {
    stream_.activate();
    inner_.detect(task, candidate, changed, projected);
  }
  void commit(std::size_t task, std::span<const std::byte> candidate,
              std::span<const std::uint64_t> changed, bool dense) override {
    stream_.activate();
    inner_.commit(task, candidate, changed, dense);
  }
  [[nodiscard]] std::vector<std::byte> tracker(std::size_t task) override {
    stream_.activate();
    return inner_.tracker(task);
  }

 private:
  device_stream stream_;  // first: outlives inner_
  ex::policy_detect_backend<ex::cuda_policy> inner_;
};

class cuda_apply final : public dcr::mirrored_apply_backend {
 public:
  cuda_apply(std::span<const std::span<std::byte>> buffers, int process_id)
      : stream_(process_id), inner_(stream_.policy(), ex::storage_regions(buffers), "cuda") {}
  [[nodiscard]] std::string device() const override { return inner_.device(); }
  void prepare(const dcr::placement_plan& plan) override {
    stream_.activate();
    inner_.prepare(plan);
  }
  std::uint64_t apply(const dcr::item& it) override {
    stream_.activate();
    return inner_.apply(it);
  }
  void upload_storage() override {
    stream_.activate();
    inner_.upload_storage();
  }
  void download_storage() override {
    stream_.activate();
    inner_.download_storage();
  }

 private:
  device_stream stream_;  // first: outlives inner_
  ex::policy_apply_backend<ex::cuda_policy> inner_;
};

}  // namespace

std::unique_ptr<dcr::mirrored_detect_backend> make_cuda_detect_backend(int process_id) {
  return std::make_unique<cuda_detect>(process_id);
}

std::unique_ptr<dcr::mirrored_apply_backend> make_cuda_apply_backend(
    std::span<const std::span<std::byte>> buffers, int process_id) {
  return std::make_unique<cuda_apply>(buffers, process_id);
}

std::string cuda_device_of(int process_id) {
  const int device = device_for(process_id);
  int devices = 0;
  DCR_CUDA_TRY(cudaGetDeviceCount(&devices));
  cudaDeviceProp prop{};
  DCR_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name) + " (device " + std::to_string(device) + " of " +
         std::to_string(devices) + ")";
}

}  // namespace dcr_tool
