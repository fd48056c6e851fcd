// tests/random_deployment.hpp: random small models and deployments for the refit tests that
// sweep layouts (tests/refit, tests/exec, tests/cuda); detect and apply backends installed on
// every owner and receiver of a started deployment; and the refit sweep that compares a
// deployment with backends against one without (tests/exec on the CPU policy, tests/cuda on the
// GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/exec/refit.hpp"
#include "dcr/sim/deployment.hpp"
#include "dcr/testing/faults.hpp"

namespace dcr_test {

/// A uniform integer in [lo, hi].
inline std::int64_t pick(dcr::sim::rng& g, std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(g.next() % static_cast<std::uint64_t>(hi - lo + 1));
}

/// A small model with shapes that often do not divide by the TP degrees (uneven splits), a
/// vocabulary that crosses the 64-row padding boundary on some ranks, and a random tie mode.
inline dcr::sim::moe_config random_model(dcr::sim::rng& g) {
  const dcr::dtype types[] = {dcr::dtype::bf16, dcr::dtype::f16, dcr::dtype::f32};
  const dcr::sim::embedding_tie ties[] = {dcr::sim::embedding_tie::none,
                                          dcr::sim::embedding_tie::omit_lm_head,
                                          dcr::sim::embedding_tie::store_both};
  dcr::sim::moe_config c;
  c.type = types[g.next() % 3];
  c.hidden = pick(g, 8, 40);
  c.kv_dim = pick(g, 1, 12);
  c.kv_groups = pick(g, 1, 5);
  c.dense_ffn = pick(g, 3, 40);
  c.expert_ffn = pick(g, 1, 10);
  c.experts = pick(g, 1, 7);
  c.layers = pick(g, 2, 3);
  c.vocab = pick(g, 3, 150);
  c.tie_embeddings = ties[g.next() % 3];
  return c;
}

/// random_model on TP degrees up to 5 (trainer and engine), DP up to 3, and plain or sharded
/// trainer and engine layouts (sharded two times in three).
inline dcr::sim::deployment_options random_deployment(dcr::sim::rng& g, int seed) {
  dcr::sim::deployment_options o;
  o.model = random_model(g);
  o.trainer_tp = static_cast<int>(pick(g, 1, 5));
  o.trainer_dp = static_cast<int>(pick(g, 1, 3));
  o.receiver_tp = static_cast<int>(pick(g, 1, 5));
  o.seed = static_cast<std::uint64_t>(seed);
  o.trainer = g.next() % 3 == 0 ? dcr::sim::trainer_layout::plain : dcr::sim::trainer_layout::megatron;
  o.engine = g.next() % 3 == 0 ? dcr::sim::engine_layout::plain : dcr::sim::engine_layout::serving;
  return o;
}

/// Detect and apply backends installed on every owner and receiver of a started deployment:
/// make_detect() makes one per owner, make_apply(buffers) one per receiver over its storage's
/// host buffers (uploaded once here). download() brings the receivers' storage back to the
/// host, for verify_against_dense_refit(). Movable: the deployment points at the backends
/// themselves, which stay where they are.
struct installed_backends {
  std::vector<std::unique_ptr<dcr::mirrored_detect_backend>> detectors;
  std::vector<std::unique_ptr<dcr::mirrored_apply_backend>> appliers;

  template <class MakeDetect, class MakeApply>
  installed_backends(dcr::sim::in_process_deployment& d, MakeDetect make_detect, MakeApply make_apply) {
    for (std::size_t k = 0; k < d.owner_count(); ++k) {
      detectors.push_back(make_detect());
      d.owner_at(k).set_detect_backend(detectors.back().get());
    }
    for (std::size_t r = 0; r < d.receiver_count(); ++r) {
      appliers.push_back(make_apply(d.storage_at(r).buffers()));
      appliers.back()->upload_storage();
      d.receiver_at(r).set_apply_backend(appliers.back().get());
    }
  }
  void download() {
    for (auto& a : appliers) a->download_storage();
  }
};

/// The policy-generic backends of dcr/exec/refit.hpp on `policy`, reporting `device`.
template <class Policy>
installed_backends policy_backends(dcr::sim::in_process_deployment& d, const Policy& policy,
                                   const std::string& device) {
  return installed_backends(
      d, [&] { return std::make_unique<dcr::exec::policy_detect_backend<Policy>>(policy, device); },
      [&](std::span<const std::span<std::byte>> buffers) {
        return std::make_unique<dcr::exec::policy_apply_backend<Policy>>(
            policy, dcr::exec::storage_regions(buffers), device);
      });
}

/// Whole refits of one random deployment (seed `seed`, compiled apply path, the only one a
/// backend takes) with backends against the same deployment without: five steps at change rates
/// 0.01, 0.3, 0, 1 and 0.01, step 2 dropping receiver 0's first delivery (attempt 0 fails, the
/// overwrite retry unites the changed sets). `install(deployment)` installs the backends and
/// returns them. Every step must commit in as many attempts as without backends, the committed
/// attempt must send the same changed elements, records and payload bytes, both deployments must
/// equal a dense refit and each other, and the backends' trackers must equal the owners'.
/// Returns one line per difference found (empty: none).
template <class Install>
std::vector<std::string> refits_with_backends_differ(int seed, Install install) {
  dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
  auto o = random_deployment(g, seed);
  o.path = dcr::apply_path::compiled;
  const std::string label = "seed " + std::to_string(seed) + " (" +
                            std::string(dcr::dtype_name(o.model.type)) + ", trainer " +
                            std::string(dcr::sim::layout_name(o.trainer)) + " tp " +
                            std::to_string(o.trainer_tp) + ", receiver tp " +
                            std::to_string(o.receiver_tp) + ")";
  std::vector<std::string> problems;
  dcr::sim::in_process_deployment plain(o), with(o);
  plain.start();
  with.start();
  installed_backends backends = install(with);
  int step = 0;
  for (double rate : {0.01, 0.3, 0.0, 1.0, 0.01}) {
    ++step;
    const std::string at = label + " step " + std::to_string(step) + " (rate " + std::to_string(rate) + ")";
    auto fail = [&](const std::string& what) { problems.push_back(at + ": " + what); };
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
    if (!a.committed || !c.committed) {
      std::string why;
      for (const auto& x : c.attempts) why += x.failure + "; ";
      fail("not committed (without backends: " + std::to_string(a.committed) + "; with: " + why + ")");
      return problems;
    }
    if (a.attempts.size() != c.attempts.size()) {
      fail(std::to_string(c.attempts.size()) + " attempts, " + std::to_string(a.attempts.size()) +
           " without backends");
      return problems;
    }
    // The committed attempt (a failed one's figures depend on when it was fenced).
    const auto& x = a.attempts.back();
    const auto& y = c.attempts.back();
    if (x.owners.changed_elements != y.owners.changed_elements || x.records != y.records ||
        x.payload_bytes != y.payload_bytes)
      fail("the committed attempt sent other payloads than without backends");
    backends.download();
    if (const auto diff = plain.verify_against_dense_refit(); !diff.empty())
      fail("without backends, not bit-exact against a dense refit: " + diff);
    if (const auto diff = with.verify_against_dense_refit(); !diff.empty())
      fail("not bit-exact against a dense refit: " + diff);
    for (std::size_t r = 0; r < with.receiver_count(); ++r)
      if (const auto diff = with.storage_at(r).first_difference(plain.storage_at(r)); !diff.empty())
        fail("receiver " + std::to_string(r) + " differs from the deployment without backends: " + diff);
    for (std::size_t k = 0; k < with.owner_count(); ++k)
      for (std::size_t i = 0; i < with.owner_at(k).tasks().size(); ++i) {
        const auto host = with.owner_at(k).tracker(i);
        const auto mirrored = backends.detectors[k]->tracker(i);
        if (!std::equal(host.begin(), host.end(), mirrored.begin(), mirrored.end()))
          fail("owner " + std::to_string(k) + " task " + std::to_string(i) +
               ": the backend's tracker differs from the owner's");
      }
  }
  return problems;
}

}  // namespace dcr_test
