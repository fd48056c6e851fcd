// Ownership: one owner per unique shard, among its holders, balanced, order-independent.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "dcr/refit/ownership.hpp"
#include "dcr/sim/random.hpp"

TEST_CASE("owners are holders, balanced by bytes, and independent of input order") {
  dcr::sim::rng g(5);
  for (int trial = 0; trial < 50; ++trial) {
    const std::uint32_t ranks = 1 + static_cast<std::uint32_t>(g.next() % 8);
    std::vector<dcr::shard_holding> shards;
    const int n = 1 + static_cast<int>(g.next() % 60);
    std::uint64_t largest = 0;
    for (int i = 0; i < n; ++i) {
      dcr::shard_holding s;
      s.name = "shard" + std::to_string(i);
      s.bytes = 1 + g.next() % 1000;
      largest = std::max(largest, s.bytes);
      for (std::uint32_t r = 0; r < ranks; ++r) s.holders.push_back(r);
      shards.push_back(s);
    }
    const auto owners = dcr::assign_owners(shards);
    std::vector<std::uint64_t> load(ranks, 0);
    for (int i = 0; i < n; ++i) {
      REQUIRE(owners[i] < ranks);
      load[owners[i]] += shards[i].bytes;
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    CHECK(*hi - *lo <= largest);  // greedy largest-first bound

    auto shuffled = shards;
    std::reverse(shuffled.begin(), shuffled.end());
    for (auto& s : shuffled) std::reverse(s.holders.begin(), s.holders.end());
    const auto again = dcr::assign_owners(shuffled);
    for (int i = 0; i < n; ++i) CHECK(again[n - 1 - i] == owners[i]);
  }
}

TEST_CASE("a shard is owned by one of its own holders") {
  std::vector<dcr::shard_holding> shards{{"a", 10, {2, 3}}, {"b", 10, {5}}, {"c", 1, {0, 1, 2, 3}}};
  const auto owners = dcr::assign_owners(shards);
  CHECK((owners[0] == 2 || owners[0] == 3));
  CHECK(owners[1] == 5);
  CHECK(owners[2] <= 3);
}

TEST_CASE("ownership refuses duplicate names and holderless shards") {
  std::vector<dcr::shard_holding> dup{{"a", 1, {0}}, {"a", 2, {1}}};
  CHECK_THROWS_AS(dcr::assign_owners(dup), dcr::error);
  std::vector<dcr::shard_holding> none{{"a", 1, {}}};
  CHECK_THROWS_AS(dcr::assign_owners(none), dcr::error);
}
