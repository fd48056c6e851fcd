// tests/cuda/test_cuda_refit.cu: the owner's detect stage and the receiver's apply stage on the
// GPU (dcr/exec/refit.hpp with dcr::exec::cuda_policy, what `dcr simulate --device cuda` runs)
// against deployments without backends: whole refits through the protocol's agents on random
// trainer and engine layouts, a retry included, must send the same payloads, end bit for bit
// equal to a dense refit, and keep the device trackers equal to the owners'. The same code on
// the CPU policy: tests/exec/test_refit_backends.cpp. Exit 0 = pass, 1 = fail, 77 = skip.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"
#include "../random_deployment.hpp"
#include "cuda_test.hpp"

namespace {

namespace ex = dcr::exec;
using dcr_test::check;

void one_deployment(int seed, const ex::cuda_policy& policy) {
  dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
  const auto o = dcr_test::random_deployment(g, seed);
  const std::string label = "seed " + std::to_string(seed);
  dcr::sim::in_process_deployment plain(o), with(o);
  plain.start();
  with.start();
  dcr_test::policy_backends<ex::cuda_policy> backends(with, policy, "cuda");
  int step = 0;
  for (double rate : {0.01, 0.3, 0.0, 1.0, 0.01}) {
    ++step;
    const std::string at = label + " step " + std::to_string(step);
    plain.trainer().stress_step(rate);
    with.trainer().stress_step(rate);
    dcr::testing::receiver_fault_plan faults;
    if (step == 2)
      faults = [](std::uint32_t attempt, std::size_t receiver, std::uint64_t ordinal) {
        return attempt == 0 && receiver == 0 && ordinal == 0 ? dcr::testing::delivery_fault::drop
                                                             : dcr::testing::delivery_fault::none;
      };
    const auto a = plain.refit({}, faults);
    const auto c = with.refit({}, faults);
    std::string failures;
    for (const auto& x : c.attempts) failures += x.failure + "; ";
    check(a.committed && c.committed, at + ": not committed (" + failures + ")");
    if (!a.committed || !c.committed || a.attempts.empty() || c.attempts.empty()) return;
    check(a.attempts.back().payload_bytes == c.attempts.back().payload_bytes &&
              a.attempts.back().changed_elements == c.attempts.back().changed_elements,
          at + ": payloads differ from the CPU paths");
    backends.download();
    const std::string diff = with.verify_against_dense_refit();
    check(diff.empty(), at + ": not bit-exact against a dense refit (" + diff + ")");
    for (std::size_t k = 0; k < with.owner_count(); ++k)
      for (std::size_t i = 0; i < with.owner_at(k).tasks().size(); ++i) {
        const auto host = with.owner_at(k).tracker(i);
        const auto device = backends.detectors[k]->tracker(i);
        check(std::equal(host.begin(), host.end(), device.begin(), device.end()),
              at + ": device tracker differs from the owner's");
      }
  }
}

}  // namespace

int main() {
  return dcr_test::run_cuda_test("cuda refit backends: bit-exact", [] {
    cudaStream_t stream = nullptr;
    DCR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const ex::cuda_policy policy = ex::cuda_policy{}.on(stream);
    for (int seed = 1; seed <= 8; ++seed) one_deployment(seed, policy);
    DCR_CUDA_TRY(cudaStreamSynchronize(stream));
    DCR_CUDA_TRY(cudaStreamDestroy(stream));
  });
}
