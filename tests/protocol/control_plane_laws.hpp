// tests/protocol/control_plane_laws.hpp: what every control plane must do, as one function run
// against each implementation (memory, file directory, etcd). `make` returns a fresh, empty
// store; `make_second` a second handle on the same store (another client of it), so that
// waiting and racing are checked across clients.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "dcr/protocol/control_plane.hpp"

namespace dcr_test {

template <class Plane>
void check_control_plane_laws(Plane& a, Plane& b) {
  using namespace std::chrono_literals;
  using dcr::key_compare;
  using dcr::key_write;

  // Absent keys, first write by compare-on-absent, then compare on the key's revision.
  CHECK_FALSE(a.get("/t/commit").has_value());
  const auto r0 = a.revision();
  CHECK(dcr::put_if(a, "/t/commit", "v0", 0));
  CHECK_FALSE(dcr::put_if(b, "/t/commit", "other", 0));  // exists: the compare fails
  auto rec = b.get("/t/commit");
  REQUIRE(rec.has_value());
  CHECK(rec->value == "v0");
  CHECK(rec->revision > r0);
  CHECK(a.revision() == rec->revision);
  CHECK(dcr::put_if(b, "/t/commit", "v1", rec->revision));
  CHECK_FALSE(dcr::put_if(a, "/t/commit", "stale", rec->revision));  // lost the race
  CHECK(a.get("/t/commit")->value == "v1");

  // A transaction over two keys applies both writes or none.
  const auto c = a.get("/t/commit")->revision;
  CHECK(dcr::put_if(a, "/t/attempt", "open", 0));
  const auto at = a.get("/t/attempt")->revision;
  {
    const key_compare cmp[] = {{"/t/commit", c}, {"/t/attempt", at + 100}};
    const key_write w[] = {{"/t/commit", "v2", 0, false}, {"/t/attempt", "committed", 0, false}};
    CHECK_FALSE(a.transact(cmp, w));
    CHECK(a.get("/t/commit")->value == "v1");
    CHECK(a.get("/t/attempt")->value == "open");
  }
  {
    const key_compare cmp[] = {{"/t/commit", c}, {"/t/attempt", at}};
    const key_write w[] = {{"/t/commit", "v2", 0, false}, {"/t/attempt", "committed", 0, false}};
    CHECK(b.transact(cmp, w));
    CHECK(a.get("/t/commit")->value == "v2");
    CHECK(a.get("/t/attempt")->value == "committed");
    CHECK(a.get("/t/commit")->revision == a.get("/t/attempt")->revision);
  }

  // Values are bytes: JSON, newlines, NUL, non-ASCII survive.
  const std::string odd = std::string("{\"k\": \"a\\nb\"}\n\0\xff\x01 tail", 20);
  dcr::put(a, "/t/odd/key with spaces%2F", odd);
  CHECK(b.get("/t/odd/key with spaces%2F")->value == odd);

  // list: by prefix, sorted by key, not beyond the prefix.
  dcr::put(a, "/t/acks/2", "x");
  dcr::put(a, "/t/acks/1", "y");
  dcr::put(a, "/t/acksfoo", "z");
  auto acks = b.list("/t/acks/");
  REQUIRE(acks.size() == 2);
  CHECK(acks[0].key == "/t/acks/1");
  CHECK(acks[1].key == "/t/acks/2");
  CHECK(acks[1].value == "x");
  dcr::erase(a, "/t/acks/1");
  CHECK(b.list("/t/acks/").size() == 1);
  CHECK_FALSE(b.get("/t/acks/1").has_value());

  // wait_for_change: times out without a change, wakes on a write by another client.
  {
    const auto now = a.revision();
    const auto t0 = dcr::protocol_clock::now();
    const auto seen = a.wait_for_change("/t/w/", now, t0 + 200ms);
    CHECK(dcr::protocol_clock::now() - t0 >= 150ms);
    CHECK(seen >= now);
    std::atomic<bool> woke{false};
    std::thread waiter([&] {
      const auto r = a.wait_for_change("/t/w/", now, dcr::protocol_clock::now() + 10s);
      woke = r > now;
    });
    std::this_thread::sleep_for(50ms);
    dcr::put(b, "/t/w/x", "1");
    waiter.join();
    CHECK(woke.load());
  }

  // Leases: a leased record vanishes once the lease is revoked or expires; keep_alive renews.
  {
    const dcr::lease_id l = a.grant_lease(std::chrono::seconds(2));
    CHECK(l != 0);
    dcr::put(a, "/t/members/r0", "alive", l);
    CHECK(b.get("/t/members/r0").has_value());
    CHECK(b.get("/t/members/r0")->lease == l);
    std::this_thread::sleep_for(1200ms);
    CHECK(a.keep_alive(l));
    std::this_thread::sleep_for(1200ms);
    CHECK(b.get("/t/members/r0").has_value());  // renewed at 1.2 s, so alive at 2.4 s
    a.revoke(l);
    CHECK_FALSE(b.get("/t/members/r0").has_value());
    CHECK_FALSE(a.keep_alive(l));
  }
  {
    const dcr::lease_id l = a.grant_lease(std::chrono::seconds(1));
    dcr::put(a, "/t/members/r1", "alive", l);
    const auto before = a.revision();
    // Expiry is a change that wait_for_change reports.
    const auto seen = b.wait_for_change("/t/members/", before, dcr::protocol_clock::now() + 10s);
    CHECK(seen > before);
    // etcd expires leases a little after their ttl; allow it up to 4 s in all.
    for (int i = 0; i < 40 && b.get("/t/members/r1").has_value(); ++i)
      std::this_thread::sleep_for(100ms);
    CHECK_FALSE(b.get("/t/members/r1").has_value());
    CHECK_FALSE(a.keep_alive(l));
  }

  // Racing compare-and-set from two clients: exactly one wins each round.
  {
    dcr::put(a, "/t/race", "0");
    std::atomic<int> wins{0};
    auto racer = [&](Plane& p) {
      for (int round = 0; round < 20; ++round) {
        auto r = p.get("/t/race");
        if (r && dcr::put_if(p, "/t/race", std::to_string(std::stoi(r->value) + 1), r->revision))
          ++wins;
      }
    };
    std::thread t1(racer, std::ref(a));
    std::thread t2(racer, std::ref(b));
    t1.join();
    t2.join();
    CHECK(std::stoi(a.get("/t/race")->value) == wins.load());
  }
}

}  // namespace dcr_test
