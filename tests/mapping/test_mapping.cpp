// Mapping laws: every mapping is injective onto its canonical region, stays in range, agrees
// with its box form, and the shards of a split cover each canonical tensor exactly once.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "dcr/mapping.hpp"
#include "dcr/sim/random.hpp"

namespace {

std::vector<std::int64_t> random_shape(dcr::sim::rng& g, int rank) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(rank));
  for (auto& e : s) e = 1 + static_cast<std::int64_t>(g.next() % 7);
  return s;
}

std::int64_t numel(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

// Adds every image of `m` to `hits` (one counter per canonical element of part 0) and checks
// each image is in range and equals the box form's image.
template <class M>
void cover(const M& m, const dcr::box& as_box, std::vector<int>& hits) {
  for (std::uint64_t i = 0; i < m.local_size(); ++i) {
    const auto d = m(i);
    REQUIRE(d.part == 0);
    REQUIRE(d.index < hits.size());
    REQUIRE(d.index < m.part_size(0));
    CHECK(as_box(i) == d);
    ++hits[d.index];
  }
}

// run_length law: a run of r indices maps to r consecutive canonical indices of one part, and
// runs are maximal enough to be useful (never 0 inside the shard).
template <class M>
void check_runs(const M& m) {
  for (std::uint64_t i = 0; i < m.local_size(); ++i) {
    const auto r = m.run_length(i);
    REQUIRE(r >= 1);
    REQUIRE(i + r <= m.local_size());
    const auto d = m(i);
    for (std::uint64_t k = 1; k < r; ++k) REQUIRE(m(i + k) == dcr::mapped_index{d.part, d.index + k});
  }
}

}  // namespace

TEST_CASE("row and column splits cover every canonical element exactly once") {
  dcr::sim::rng g(7);
  for (int trial = 0; trial < 200; ++trial) {
    const auto shape = random_shape(g, 1 + static_cast<int>(g.next() % 4));
    const int world = 1 + static_cast<int>(g.next() % 8);
    std::vector<int> rows(static_cast<std::size_t>(numel(shape)), 0);
    std::vector<int> cols(rows.size(), 0);
    std::uint64_t local_total = 0;
    for (int r = 0; r < world; ++r) {
      dcr::row_split rs(shape, world, r);
      dcr::column_split cs(shape, world, r);
      cover(rs, rs.to_box(shape), rows);
      cover(cs, cs.to_box(shape), cols);
      check_runs(rs);
      check_runs(cs);
      check_runs(rs.to_box(shape));
      check_runs(cs.to_box(shape));
      local_total += rs.local_size();
      CHECK(rs.is_exhaustive() == (world == 1 || rs.local_size() == rows.size()));
    }
    CHECK(local_total == rows.size());
    CHECK(std::all_of(rows.begin(), rows.end(), [](int h) { return h == 1; }));
    CHECK(std::all_of(cols.begin(), cols.end(), [](int h) { return h == 1; }));
  }
}

TEST_CASE("replicated is the identity and its box covers the tensor") {
  const std::vector<std::int64_t> shape{3, 5};
  dcr::replicated m(15);
  std::vector<int> hits(15, 0);
  cover(m, m.to_box(shape), hits);
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  CHECK(m.is_exhaustive());
}

TEST_CASE("a permuted box is injective, in range, and walks local axes in row-major order") {
  dcr::sim::rng g(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int rank = 1 + static_cast<int>(g.next() % 4);
    const auto shape = random_shape(g, rank);
    std::vector<std::int64_t> off(shape.size()), ext(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      off[d] = static_cast<std::int64_t>(g.next() % static_cast<std::uint64_t>(shape[d]));
      ext[d] = 1 + static_cast<std::int64_t>(g.next() % static_cast<std::uint64_t>(shape[d] - off[d]));
    }
    std::vector<int> axes(shape.size());
    std::iota(axes.begin(), axes.end(), 0);
    for (std::size_t k = axes.size(); k > 1; --k) std::swap(axes[k - 1], axes[g.next() % k]);
    dcr::box b(shape, off, ext, axes);
    check_runs(b);
    REQUIRE(b.local_size() == static_cast<std::uint64_t>(numel(ext)));
    std::vector<int> hits(static_cast<std::size_t>(numel(shape)), 0);
    // Reference: enumerate local coordinates row-major over the permuted extents.
    std::vector<std::int64_t> local(shape.size(), 0);
    for (std::uint64_t i = 0; i < b.local_size(); ++i) {
      std::int64_t expect = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        std::int64_t c = 0;
        for (std::size_t k = 0; k < shape.size(); ++k)
          if (axes[k] == static_cast<int>(d)) c = local[k];
        expect = expect * shape[d] + off[d] + c;
      }
      const auto got = b(i);
      REQUIRE(got.index == static_cast<std::uint64_t>(expect));
      ++hits[got.index];
      for (int k = rank - 1; k >= 0; --k) {
        if (++local[static_cast<std::size_t>(k)] < ext[static_cast<std::size_t>(axes[static_cast<std::size_t>(k)])]) break;
        local[static_cast<std::size_t>(k)] = 0;
      }
    }
    CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h <= 1; }));
    CHECK(std::count(hits.begin(), hits.end(), 1) == numel(ext));
  }
}

TEST_CASE("stacked maps expert slices to their own canonical tensors") {
  const std::vector<std::int64_t> shape{4, 6};
  const std::vector<std::int64_t> zeros{0, 0};
  dcr::stacked s(3, dcr::box(shape, zeros, shape));
  CHECK(s.local_size() == 72);
  CHECK(s.parts() == 3);
  check_runs(s);
  const std::vector<std::int64_t> half{4, 3}, col{0, 3};
  check_runs(dcr::stacked(2, dcr::box(shape, col, half)));
  std::vector<std::vector<int>> hits(3, std::vector<int>(24, 0));
  for (std::uint64_t i = 0; i < s.local_size(); ++i) {
    const auto d = s(i);
    REQUIRE(d.part < 3);
    CHECK(d.part == i / 24);
    CHECK(d.index == i % 24);
    ++hits[d.part][d.index];
  }
  for (const auto& h : hits) CHECK(std::all_of(h.begin(), h.end(), [](int x) { return x == 1; }));

  // The reverse: per-expert sources are boxes of a stacked canonical tensor.
  const std::vector<std::int64_t> stack{3, 4, 6};
  std::vector<int> all(72, 0);
  for (int e = 0; e < 3; ++e) {
    auto b = dcr::stacked::expert_of_stack(stack, e);
    CHECK(b.local_size() == 24);
    for (std::uint64_t i = 0; i < 24; ++i) ++all[b(i).index];
  }
  CHECK(std::all_of(all.begin(), all.end(), [](int x) { return x == 1; }));
  CHECK_THROWS_AS(dcr::stacked::expert_of_stack(stack, 3), dcr::error);
}

TEST_CASE("bad mapping arguments are refused with dcr::error") {
  const std::vector<std::int64_t> shape{4, 6};
  CHECK_THROWS_AS(dcr::row_split(shape, 2, 2), dcr::error);
  CHECK_THROWS_AS(dcr::column_split(shape, 0, 0), dcr::error);
  const std::vector<std::int64_t> off{3, 0}, ext{2, 6};
  try {
    dcr::box b(shape, off, ext);
    FAIL("box past the tensor accepted");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::out_of_range);
  }
  const std::vector<std::int64_t> ok_off{0, 0};
  const std::vector<int> not_perm{0, 0};
  CHECK_THROWS_AS(dcr::box(shape, ok_off, shape, not_perm), dcr::error);
  // Shapes whose element count overflows 64 bits (the products wrapped before).
  constexpr std::int64_t two32 = std::int64_t{1} << 32;
  const std::vector<std::int64_t> huge{two32, two32}, huge_rows{0, two32, two32};
  const std::vector<std::int64_t> zero2{0, 0};
  for (const auto& s : {huge, huge_rows}) {
    const auto code_of = [](auto f) {
      try {
        f();
      } catch (const dcr::error& e) {
        return e.dcr_code();
      }
      return dcr::errc::ok;
    };
    CHECK(code_of([&] { dcr::row_split(s, 2, 0); }) == dcr::errc::overflow);
    if (s == huge) {
      CHECK(code_of([&] { dcr::column_split(s, 2, 0); }) == dcr::errc::overflow);
      CHECK(code_of([&] { dcr::box(s, zero2, zero2); }) == dcr::errc::overflow);
    }
  }
}

TEST_CASE("balanced_split partitions [0, n) in order") {
  for (int n = 0; n < 40; ++n)
    for (int world = 1; world <= 9; ++world) {
      std::int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const auto s = dcr::balanced_split(n, world, r);
        CHECK(s.begin == next);
        CHECK(s.size() >= n / world);
        CHECK(s.size() <= n / world + 1);
        next = s.end;
      }
      CHECK(next == n);
    }
}
