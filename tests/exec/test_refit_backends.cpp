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
using dcr::sim::engine_layout;
using dcr::sim::in_process_deployment;
using dcr::sim::trainer_layout;

/// random_deployment on the compiled apply path (the only one an apply backend takes).
dcr::sim::deployment_options random_options(dcr::sim::rng& g, int seed) {
  auto o = dcr_test::random_deployment(g, seed);
  o.path = dcr::apply_path::compiled;
  return o;
}

/// The CPU policy's backends under the device name "test" (checked to be what the agents report).
struct backed : dcr_test::policy_backends<ex::cpu_policy> {
  backed(in_process_deployment& d, ex::cpu_policy policy) : policy_backends(d, policy, "test") {
    for (std::size_t k = 0; k < d.owner_count(); ++k) CHECK(d.owner_at(k).detect_device() == "test");
    for (std::size_t r = 0; r < d.receiver_count(); ++r) CHECK(d.receiver_at(r).apply_device() == "test");
  }
};

}  // namespace

TEST_CASE("refits through the policy-generic detect and apply backends equal the CPU paths") {
  const double rates[] = {0.01, 0.3, 0.0, 1.0, 0.01};
  for (int seed = 1; seed <= 12; ++seed) {
    dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 7919);
    const auto o = random_options(g, seed);
    const ex::cpu_policy policy = ex::cpu.on(seed % 2 ? 1 : 3);
    CAPTURE(seed);
    CAPTURE(o.trainer_tp);
    CAPTURE(o.receiver_tp);
    CAPTURE(std::string(dcr::dtype_name(o.model.type)));
    CAPTURE(std::string(dcr::sim::layout_name(o.trainer)));
    in_process_deployment plain(o), with(o);
    plain.start();
    with.start();
    backed b(with, policy);
    int step = 0;
    for (double rate : rates) {
      ++step;
      CAPTURE(rate);
      plain.trainer().stress_step(rate);
      with.trainer().stress_step(rate);
      // Step 2 drops receiver 0's first delivery: attempt 0 fails, the overwrite retry unites
      // the changed sets (the owners then project the union themselves).
      dcr::testing::receiver_fault_plan faults;
      if (step == 2)
        faults = [](std::uint32_t attempt, std::size_t receiver, std::uint64_t ordinal) {
          return attempt == 0 && receiver == 0 && ordinal == 0 ? dcr::testing::delivery_fault::drop
                                                               : dcr::testing::delivery_fault::none;
        };
      const auto a = plain.refit({}, faults);
      const auto c = with.refit({}, faults);
      std::string failures;
      for (const auto& at : c.attempts) failures += at.failure + "; ";
      CAPTURE(failures);
      REQUIRE(a.committed);
      REQUIRE(c.committed);
      REQUIRE(a.attempts.size() == c.attempts.size());
      // The committed attempt (a failed one's figures depend on when it was fenced).
      CHECK(a.attempts.back().changed_elements == c.attempts.back().changed_elements);
      CHECK(a.attempts.back().records == c.attempts.back().records);
      CHECK(a.attempts.back().payload_bytes == c.attempts.back().payload_bytes);
      b.download();
      CHECK(plain.verify_against_dense_refit() == "");
      CHECK(with.verify_against_dense_refit() == "");
      for (std::size_t r = 0; r < with.receiver_count(); ++r)
        CHECK(with.storage_at(r).first_difference(plain.storage_at(r)) == "");
      for (std::size_t k = 0; k < with.owner_count(); ++k)
        for (std::size_t i = 0; i < with.owner_at(k).tasks().size(); ++i) {
          const auto host = with.owner_at(k).tracker(i);
          const auto mirrored = b.detectors[k]->tracker(i);
          CHECK(std::equal(host.begin(), host.end(), mirrored.begin(), mirrored.end()));
        }
    }
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
