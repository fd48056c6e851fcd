// dcr::pipeline_stage: items are worked on in order with at most `depth` in flight, the first
// error of the work reaches the producer (dropping what was queued after it, and the idle
// work), idle work runs only while nothing is queued, and discard() waits for an idle step in
// progress before the producer may release what it reads.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../error_capture.hpp"
#include "dcr/error.hpp"
#include "dcr/pipeline.hpp"

using dcr::errc;
using dcr::pipeline_stage;

TEST_CASE("pipeline_stage: submission order, at most depth in flight") {
  for (std::size_t depth : {1u, 2u, 4u}) {
    CAPTURE(depth);
    std::mutex m;
    std::vector<int> seen;
    std::atomic<int> submitted{0}, done{0};
    std::size_t most_ahead = 0;
    {
      pipeline_stage<int> stage(depth, [&](int& x) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard lock(m);
        seen.push_back(x);
        ++done;
      });
      for (int i = 0; i < 50; ++i) {
        stage.submit(i);
        ++submitted;
        most_ahead = std::max<std::size_t>(most_ahead, static_cast<std::size_t>(submitted - done));
      }
      stage.drain();
      CHECK(done == 50);
    }
    CHECK(most_ahead <= depth);
    std::vector<int> expect(50);
    for (int i = 0; i < 50; ++i) expect[static_cast<std::size_t>(i)] = i;
    CHECK(seen == expect);
  }
  CHECK(dcr_test::code_of([] { pipeline_stage<int> s(0, [](int&) {}); }) == errc::invalid_argument);
}

TEST_CASE("pipeline_stage: the work's first error reaches the producer; discard resets") {
  std::atomic<int> worked{0};
  pipeline_stage<int> stage(2, [&](int& x) {
    ++worked;
    if (x == 3) throw dcr::error(errc::io_error, "item 3 failed (test)");
  });
  std::string what;
  try {
    for (int i = 0; i < 100; ++i) stage.submit(i);
    stage.drain();
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == errc::io_error);
    what = e.what();
  }
  CHECK(what.find("item 3 failed (test)") != std::string::npos);
  CHECK(worked == 4);  // what was queued after the failure was dropped
  stage.discard();
  stage.submit(7);
  stage.drain();  // usable again, no stale error
  CHECK(worked == 5);
}

TEST_CASE("pipeline_stage: idle work between items, cancelled by a failure and by discard") {
  std::atomic<int> idle_steps{0};
  std::atomic<bool> in_idle{false};
  std::atomic<int> budget{0};
  pipeline_stage<int> stage(
      1, [](int& x) { if (x < 0) throw dcr::error(errc::io_error, "negative (test)"); },
      [&] {
        in_idle = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++idle_steps;
        in_idle = false;
        return --budget > 0;
      });
  // Runs until it says it is done.
  budget = 5;
  stage.wake_idle();
  for (int spin = 0; spin < 5000 && idle_steps < 5; ++spin)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(idle_steps == 5);
  stage.submit(1);
  stage.drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(idle_steps == 5);  // not woken again
  // discard() waits for the idle step in progress, and no step starts after it.
  budget = 1000000;
  stage.wake_idle();
  while (idle_steps < 7) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stage.discard();
  CHECK_FALSE(in_idle.load());
  const int after_discard = idle_steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(idle_steps == after_discard);
  // A failure of the work drops the pending idle work too.
  stage.wake_idle();
  stage.submit(-1);
  CHECK(dcr_test::code_of([&] { stage.drain(); }) == errc::io_error);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int after_failure = idle_steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(idle_steps == after_failure);
}

TEST_CASE("pipeline_stage: an item a producer is handing over goes before idle work") {
  std::mutex m;
  std::vector<std::string> log;
  std::atomic<bool> started{false};
  const auto note = [&](std::string what) {
    std::lock_guard lock(m);
    log.push_back(std::move(what));
  };
  pipeline_stage<int> stage(
      1,
      [&](int& x) {
        note("start " + std::to_string(x));
        started = true;
        if (x == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        note("end " + std::to_string(x));
      },
      [&] {
        note("idle");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return true;
      });
  stage.submit(0);
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stage.wake_idle();
  stage.submit(1);  // waits for item 0; no idle step may start in between
  stage.drain();
  stage.discard();
  std::lock_guard lock(m);
  const auto end0 = std::find(log.begin(), log.end(), "end 0");
  REQUIRE(end0 != log.end());
  REQUIRE(end0 + 1 != log.end());
  CHECK(*(end0 + 1) == "start 1");
}

TEST_CASE("pipeline_stage: an unused stage starts no thread; destruction joins") {
  { pipeline_stage<int> unused(1, [](int&) {}); }
  std::atomic<bool> started{false}, finished{false};
  {
    pipeline_stage<int> stage(1, [&](int&) {
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      finished = true;
    });
    stage.submit(0);
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }  // lets the current item finish, then joins
  CHECK(finished.load());
}
