// tests/random_shard.hpp: a tracker and a candidate shard for detect tests on every backend, and
// detect_compact on a host-memory policy into vectors. Shared by tests/exec and tests/cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "dcr/exec/algorithms.hpp"

namespace dcr_test {

/// Tracker of random words; the candidate changes about `rate` of them (a few low bits flip),
/// plus the cases float equality gets wrong: +0 -> -0 at the front, one NaN payload -> another
/// in the middle, and an unchanged NaN at the end (NaN != NaN as floats, same bits here).
template <class W>
void make_shard(std::mt19937_64& rng, std::size_t n, double rate, std::vector<W>& tracker,
                std::vector<W>& candidate) {
  tracker.resize(n);
  for (auto& w : tracker) w = static_cast<W>(rng());
  candidate = tracker;
  std::bernoulli_distribution change(rate);
  for (std::size_t i = 0; i < n; ++i)
    if (change(rng)) candidate[i] = static_cast<W>(tracker[i] ^ static_cast<W>(1 + rng() % 0xff));
  constexpr W sign = static_cast<W>(W{1} << (8 * sizeof(W) - 1));
  const W nan_a = static_cast<W>(~W{0} >> 1);  // exponent and payload bits all set
  const W nan_b = static_cast<W>(nan_a ^ W{1});  // another payload
  if (n >= 3) {
    tracker[0] = 0;
    candidate[0] = sign;
    tracker[n / 2] = nan_a;
    candidate[n / 2] = nan_b;
    tracker[n - 1] = nan_a;
    candidate[n - 1] = nan_a;
  }
}

/// What detect_compact found: the changed indices with their old and new words.
template <class W>
struct compacted {
  std::vector<std::uint64_t> index;
  std::vector<W> old_words, new_words;
  bool operator==(const compacted&) const = default;
};

/// dcr::exec::detect_compact on a policy over host memory (no workspace), into vectors.
template <class P, class W>
compacted<W> run_detect(const P& policy, const std::vector<W>& tracker,
                        const std::vector<W>& candidate, std::uint64_t first) {
  const std::size_t n = tracker.size();
  compacted<W> c;
  c.index.assign(n, ~std::uint64_t{0});
  c.old_words.assign(n, 0);
  c.new_words.assign(n, 0);
  const std::size_t count = dcr::exec::detect_compact(
      policy, tracker.data(), candidate.data(), n,
      dcr::exec::changed_words<W>{c.index.data(), c.old_words.data(), c.new_words.data()}, {},
      first);
  c.index.resize(count);
  c.old_words.resize(count);
  c.new_words.resize(count);
  return c;
}

}  // namespace dcr_test
