// tests/cuda/cuda_backends.hpp: the CUDA detect and apply backends of dcr/exec/refit.hpp behind
// plain C++ types, so that a test which drives whole deployments (tests/cuda/test_cuda_refit.cpp)
// is compiled by the host compiler and only cuda_backends.cu, which instantiates the backends
// with dcr::exec::cuda_policy, goes through nvcc. Every call makes the test's device current.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/apply/apply_backend.hpp"
#include "dcr/refit/detect_backend.hpp"

namespace dcr_test {

/// An owner's detect stage on the device, with its device tracker readable for checks.
class cuda_detect_backend : public dcr::detect_backend {
 public:
  /// The device tracker of task `task` (copied back to the host).
  [[nodiscard]] virtual std::vector<std::byte> tracker(std::size_t task) = 0;
};

/// A receiver's compiled-path apply into a device copy of the engine storage.
class cuda_apply_backend : public dcr::apply_backend {
 public:
  /// Host storage -> device copy (after a dense load wrote the host buffers).
  virtual void upload_storage() = 0;
  /// Device copy -> host storage (before comparing with a dense refit).
  virtual void download_storage() = 0;
};

/// The CUDA device and stream the backends share (one per test program).
class cuda_session {
 public:
  /// Device 0 and a non-blocking stream on it. Call only where cuda_device_present().
  cuda_session();
  ~cuda_session();
  cuda_session(const cuda_session&) = delete;
  cuda_session& operator=(const cuda_session&) = delete;

  [[nodiscard]] std::unique_ptr<cuda_detect_backend> make_detect() const;
  /// Over the storage's host `buffers`; call upload_storage() once they hold the start state.
  [[nodiscard]] std::unique_ptr<cuda_apply_backend> make_apply(
      std::span<const std::span<std::byte>> buffers) const;
  /// Waits for everything enqueued on the session's stream.
  void synchronize() const;

 private:
  void* stream_ = nullptr;  // cudaStream_t, kept opaque for the host compiler
};

/// Whether the CUDA runtime sees a device; `why` says why not.
bool cuda_device_present(std::string& why);

}  // namespace dcr_test
