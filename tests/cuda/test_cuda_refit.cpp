// tests/cuda/test_cuda_refit.cpp: the owner's detect stage and the receiver's apply stage on the
// GPU (dcr/exec/refit.hpp with dcr::exec::cuda_policy, what `dcr simulate --device cuda` runs)
// against deployments without backends: whole refits through the protocol's agents on random
// trainer and engine layouts, a retry included, must send the same payloads, end bit for bit
// equal to a dense refit, and keep the device trackers equal to the owners'. The same code on
// the CPU policy: tests/exec/test_refit_backends.cpp. Exit 0 = pass, 1 = fail, 77 = skip.
//
// A host C++ unit: the deployments, agents and checks compile with the host compiler; only the
// backends (cuda_backends.cu) go through nvcc.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "../random_deployment.hpp"
#include "cuda_backends.hpp"
#include "dcr/testing/faults.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

/// The CUDA backends on every owner and receiver of a started deployment.
struct installed_backends {
  std::vector<std::unique_ptr<dcr_test::cuda_detect_backend>> detectors;
  std::vector<std::unique_ptr<dcr_test::cuda_apply_backend>> appliers;

  installed_backends(dcr::sim::in_process_deployment& d, const dcr_test::cuda_session& session) {
    for (std::size_t k = 0; k < d.owner_count(); ++k) {
      detectors.push_back(session.make_detect());
      d.owner_at(k).set_detect_backend(detectors.back().get());
    }
    for (std::size_t r = 0; r < d.receiver_count(); ++r) {
      appliers.push_back(session.make_apply(d.storage_at(r).buffers()));
      appliers.back()->upload_storage();
      d.receiver_at(r).set_apply_backend(appliers.back().get());
    }
  }
  void download() {
    for (auto& a : appliers) a->download_storage();
  }
};

void one_deployment(int seed, const dcr_test::cuda_session& session) {
  dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
  const auto o = dcr_test::random_deployment(g, seed);
  const std::string label = "seed " + std::to_string(seed);
  dcr::sim::in_process_deployment plain(o), with(o);
  plain.start();
  with.start();
  installed_backends backends(with, session);
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
    std::string why;
    for (const auto& x : c.attempts) why += x.failure + "; ";
    check(a.committed && c.committed, at + ": not committed (" + why + ")");
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
  std::string why;
  if (!dcr_test::cuda_device_present(why)) {
    std::printf("no CUDA device: skipping (%s)\n", why.c_str());
    return 77;
  }
  try {
    const dcr_test::cuda_session session;
    for (int seed = 1; seed <= 8; ++seed) one_deployment(seed, session);
    session.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("cuda refit backends: bit-exact\n");
  return 0;
}
