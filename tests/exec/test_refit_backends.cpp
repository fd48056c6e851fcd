// tests/exec/test_refit_backends.cpp: the owner's detect stage and the receiver's apply stage
// through the hooks (dcr::detect_backend, dcr::apply_backend) with the policy-generic backends
// of dcr/exec/refit.hpp on the CPU policy (one and three threads): the code `dcr simulate
// --device cuda` runs with the CUDA policy, on a policy that runs here. Whole refits through the
// protocol's agents (dcr::sim::in_process_deployment) on randomized trainer and engine layouts,
// with retries (a dropped delivery), must send exactly the payloads a deployment without
// backends sends, end bit for bit equal to a dense refit, and keep the backends' trackers equal
// to the owners'.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "../error_capture.hpp"
#include "../random_deployment.hpp"

namespace {

namespace ex = dcr::exec;
using dcr::sim::in_process_deployment;

/// random_deployment on the compiled apply path (the only one an apply backend takes).
dcr::sim::deployment_options random_options(dcr::sim::rng& g, int seed) {
  auto o = dcr_test::random_deployment(g, seed);
  o.path = dcr::apply_path::compiled;
  return o;
}

/// The CPU policy's backends under the device name "test" (checked to be what the agents report).
struct backed : dcr_test::installed_backends {
  backed(in_process_deployment& d, ex::cpu_policy policy)
      : installed_backends(dcr_test::policy_backends(d, policy, "test")) {
    for (std::size_t k = 0; k < d.owner_count(); ++k) CHECK(d.owner_at(k).detect_device() == "test");
    for (std::size_t r = 0; r < d.receiver_count(); ++r) CHECK(d.receiver_at(r).apply_device() == "test");
  }
};

}  // namespace

TEST_CASE("refits through the policy-generic detect and apply backends equal the CPU paths") {
  for (int seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    const ex::cpu_policy policy = ex::cpu.on(seed % 2 ? 1 : 3);
    const auto problems = dcr_test::refits_with_backends_differ(
        seed, [&](in_process_deployment& d) -> dcr_test::installed_backends { return backed(d, policy); });
    for (const auto& p : problems) FAIL_CHECK(p);
    CHECK(problems.empty());
  }
}

TEST_CASE("an apply backend refuses the general path and post-apply checks before any write") {
  dcr::sim::rng g(99);
  const auto o = random_options(g, 3);
  in_process_deployment d(o);
  d.start();
  backed b(d, ex::cpu);
  // An item that would write: every element of the first tensor receiver 0 holds, as overwrite.
  auto& rx = d.receiver_at(0);
  const auto& reg = d.registry();
  dcr::tensor_id id = 0;
  while (id < reg.size() && rx.plan().skips(id)) ++id;
  REQUIRE(id < reg.size());
  const auto& t = reg.at(id);
  dcr::item it;
  it.tensor = id;
  it.type = t.type;
  it.enc = dcr::encoding::overwrite;
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(t.numel()); ++i) it.indices.push_back(i);
  it.values.assign(it.indices.size() * it.word_bytes(), std::byte{0x3c});
  const std::vector<dcr::item> items{it};
  dcr::sim::moe_engine_loader loader(d.storage_at(0));
  dcr::item_applier<dcr::sim::moe_engine_loader> applier(reg, loader);
  applier.prewarm();
  applier.set_backend(b.appliers[0].get());
  for (const auto& opts : {dcr::apply_options{dcr::apply_path::general, false},
                           dcr::apply_options{dcr::apply_path::compiled, true}}) {
    const auto call = [&] { (void)applier.apply(items, opts); };
    CHECK(dcr_test::code_of(call) == dcr::errc::invalid_argument);
    CHECK(dcr_test::message_of(call).find("compiled path only") != std::string::npos);
  }
  b.download();
  CHECK(d.verify_against_dense_refit() == "");  // nothing was written
  const auto stats = applier.apply(items, dcr::apply_options{});
  CHECK(stats.writes > 0);
  b.download();
  CHECK(d.verify_against_dense_refit() != "");  // now the backend's copy was written
}

TEST_CASE("an apply backend refuses records that write outside the storage it mirrors") {
  dcr::sim::rng g(5);
  const auto o = random_options(g, 5);
  in_process_deployment d(o);
  d.start();
  auto buffers = d.storage_at(0).buffers();
  REQUIRE(buffers.size() > 1);
  std::vector<ex::storage_region> regions{{buffers[0].data(), buffers[0].size()}};
  ex::policy_apply_backend<ex::cpu_policy> partial(ex::cpu, regions);
  const auto call = [&] { d.receiver_at(0).set_apply_backend(&partial); };
  CHECK(dcr_test::code_of(call) == dcr::errc::invalid_argument);
  CHECK(dcr_test::message_of(call).find("outside the mirrored storage") != std::string::npos);
}
