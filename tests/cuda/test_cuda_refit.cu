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
#include "dcr/exec/refit.hpp"
#include "dcr/sim/deployment.hpp"
#include "cuda_test.hpp"

namespace {

namespace ex = dcr::exec;
using dcr_test::check;

std::int64_t pick(dcr::sim::rng& g, std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(g.next() % static_cast<std::uint64_t>(hi - lo + 1));
}

dcr::sim::deployment_options random_options(dcr::sim::rng& g, int seed) {
  const dcr::dtype types[] = {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32};
  dcr::sim::deployment_options o;
  auto& c = o.model;
  c.type = types[g.next() % 3];
  c.hidden = pick(g, 8, 40);
  c.kv_dim = pick(g, 1, 12);
  c.kv_groups = pick(g, 1, 5);
  c.dense_ffn = pick(g, 3, 40);
  c.expert_ffn = pick(g, 1, 10);
  c.experts = pick(g, 1, 7);
  c.layers = pick(g, 2, 3);
  c.vocab = pick(g, 3, 150);
  c.tie_embeddings = static_cast<dcr::sim::embedding_tie>(g.next() % 3);
  o.trainer_tp = static_cast<int>(pick(g, 1, 5));
  o.trainer_dp = static_cast<int>(pick(g, 1, 3));
  o.receiver_tp = static_cast<int>(pick(g, 1, 5));
  o.seed = static_cast<std::uint64_t>(seed);
  o.trainer = g.next() % 3 == 0 ? dcr::sim::trainer_layout::plain : dcr::sim::trainer_layout::megatron;
  o.engine = g.next() % 3 == 0 ? dcr::sim::engine_layout::plain : dcr::sim::engine_layout::serving;
  return o;
}

void one_deployment(int seed, const ex::cuda_policy& policy) {
  dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
  const auto o = random_options(g, seed);
  const std::string label = "seed " + std::to_string(seed);
  dcr::sim::in_process_deployment plain(o), with(o);
  plain.start();
  with.start();
  std::vector<std::unique_ptr<ex::policy_detect_backend<ex::cuda_policy>>> detectors;
  std::vector<std::unique_ptr<ex::policy_apply_backend<ex::cuda_policy>>> appliers;
  for (std::size_t k = 0; k < with.owner_count(); ++k) {
    detectors.push_back(std::make_unique<ex::policy_detect_backend<ex::cuda_policy>>(policy, "cuda"));
    with.owner_at(k).set_detect_backend(detectors.back().get());
  }
  for (std::size_t r = 0; r < with.receiver_count(); ++r) {
    std::vector<ex::storage_region> regions;
    for (auto b : with.storage_at(r).buffers()) regions.push_back({b.data(), b.size()});
    appliers.push_back(std::make_unique<ex::policy_apply_backend<ex::cuda_policy>>(policy, regions, "cuda"));
    appliers.back()->upload_storage();
    with.receiver_at(r).set_apply_backend(appliers.back().get());
  }
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
    for (auto& ap : appliers) ap->download_storage();
    const std::string diff = with.verify_against_dense_refit();
    check(diff.empty(), at + ": not bit-exact against a dense refit (" + diff + ")");
    for (std::size_t k = 0; k < with.owner_count(); ++k)
      for (std::size_t i = 0; i < with.owner_at(k).tasks().size(); ++i) {
        const auto host = with.owner_at(k).tracker(i);
        const auto device = detectors[k]->tracker(i);
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
