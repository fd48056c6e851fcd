// tests/random_deployment.hpp: random small models and deployments for the refit tests that
// sweep layouts (tests/refit, tests/exec, tests/cuda), and the detect and apply backends of an
// execution policy installed on every owner and receiver of a started deployment.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/exec/refit.hpp"
#include "dcr/sim/deployment.hpp"

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

/// The detect backend of `Policy` on every owner of a started deployment and its apply backend
/// on every receiver (over the receiver's storage, uploaded once here). download() brings the
/// receivers' storage back to the host, for verify_against_dense_refit().
template <class Policy>
struct policy_backends {
  std::vector<std::unique_ptr<dcr::exec::policy_detect_backend<Policy>>> detectors;
  std::vector<std::unique_ptr<dcr::exec::policy_apply_backend<Policy>>> appliers;

  policy_backends(dcr::sim::in_process_deployment& d, const Policy& policy, const std::string& device) {
    for (std::size_t k = 0; k < d.owner_count(); ++k) {
      detectors.push_back(std::make_unique<dcr::exec::policy_detect_backend<Policy>>(policy, device));
      d.owner_at(k).set_detect_backend(detectors.back().get());
    }
    for (std::size_t r = 0; r < d.receiver_count(); ++r) {
      std::vector<dcr::exec::storage_region> regions;
      for (auto b : d.storage_at(r).buffers()) regions.push_back({b.data(), b.size()});
      appliers.push_back(std::make_unique<dcr::exec::policy_apply_backend<Policy>>(policy, regions, device));
      appliers.back()->upload_storage();
      d.receiver_at(r).set_apply_backend(appliers.back().get());
    }
  }
  void download() {
    for (auto& a : appliers) a->download_storage();
  }
};

}  // namespace dcr_test
