// Sinks: delta_sink finds a copy's changed elements by address, exactly, for every strided view
// a loader can build; rejects views it cannot invert; dense_sink copies and keeps its log.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "dcr/apply/sink.hpp"
#include "test_engine.hpp"

namespace {

using dcr::delta_pass;
using dcr::delta_sink;
using dcr::encoding;
using dcr::errc;
using dcr::tensor_view;

dcr::errc code_of(auto&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return errc::ok;
}

/// A random strided view of `base` (contiguous `shape`): slices, selects, transposes, reversed
/// dimensions (negative strides) and reshapes of contiguous intermediates.
template <class W>
tensor_view<const W> random_view(std::mt19937_64& rng, const W* base,
                                 const std::vector<std::int64_t>& shape) {
  auto v = tensor_view<const W>::contiguous(base, shape);
  const int ops = static_cast<int>(rng() % 6);
  for (int k = 0; k < ops; ++k) {
    if (v.rank() == 0) break;
    const int d = static_cast<int>(rng() % static_cast<unsigned>(v.rank()));
    const std::int64_t e = v.extent(d);
    switch (rng() % 5) {
      case 0: {  // slice
        const std::int64_t start = e == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e + 1));
        const std::int64_t len = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e - start + 1));
        v = v.slice(d, start, len);
        break;
      }
      case 1:  // select
        if (e > 0 && v.rank() > 1) v = v.select(d, static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e)));
        break;
      case 2:  // transpose
        v = v.transpose(d, static_cast<int>(rng() % static_cast<unsigned>(v.rank())));
        break;
      case 3: {  // reverse dimension d (a negative stride)
        if (e == 0) break;
        dcr::index_array str = v.strides();
        str[d] = -str[d];
        v = tensor_view<const W>(v.data() + (e - 1) * v.stride(d), v.rank(), v.extents(), str);
        break;
      }
      case 4:  // reshape a contiguous view into a split of its size
        if (v.is_contiguous() && v.size() > 0) {
          const std::int64_t n = v.size();
          std::int64_t f = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
          while (n % f != 0) --f;
          v = v.reshape({f, n / f});
        }
        break;
    }
  }
  return v;
}

/// A destination of src's shape in a random layout (permuted dims, padded strides) inside a
/// buffer whose other words must stay untouched.
template <class W>
tensor_view<W> random_dst(std::mt19937_64& rng, std::vector<W>& buffer, const tensor_view<const W>& src) {
  std::vector<int> order(static_cast<std::size_t>(src.rank()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  dcr::index_array str{};
  std::int64_t s = 1;
  for (int j = src.rank() - 1; j >= 0; --j) {
    str[order[j]] = s;
    s *= src.extent(order[j]) + static_cast<std::int64_t>(rng() % 2);
  }
  buffer.resize(static_cast<std::size_t>(std::max<std::int64_t>(s, 1)));
  for (auto& w : buffer) w = static_cast<W>(rng());
  return tensor_view<W>(buffer.data(), src.rank(), src.extents(), str);
}

template <class W>
void check_random_views(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 400; ++round) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(rank));
    for (auto& e : shape) e = static_cast<std::int64_t>(rng() % 6);
    if (rng() % 8 != 0)
      for (auto& e : shape) e = std::max<std::int64_t>(e, 1);
    const dcr::canonical_tensor t{"t", sizeof(W) == 2 ? dcr::dtype::bf16 : dcr::dtype::f32, shape};
    const std::int64_t numel = t.numel();
    std::vector<W> scratch(static_cast<std::size_t>(std::max<std::int64_t>(numel, 1)), 0);
    auto src = random_view(rng, scratch.data(), shape);
    std::vector<W> buffer;
    auto dst = random_dst(rng, buffer, src);

    // Active set at a random density, values random (NaN patterns included).
    std::vector<std::uint64_t> active;
    const unsigned density = 1 + static_cast<unsigned>(rng() % 4);
    for (std::int64_t i = 0; i < numel; ++i)
      if (rng() % density == 0) active.push_back(static_cast<std::uint64_t>(i));
    std::vector<W> values(active.size());
    for (auto& w : values) w = dcr_test::random_word<W>(rng, t.type);
    const encoding enc = rng() % 2 ? encoding::xor_mask : encoding::overwrite;

    // Reference: walk every logical element of the view.
    std::vector<W> expected = buffer;
    std::uint64_t expected_writes = 0;
    for (std::int64_t i = 0; i < src.size(); ++i) {
      const auto off = static_cast<std::uint64_t>(&src[i] - scratch.data());
      auto it = std::lower_bound(active.begin(), active.end(), off);
      if (it == active.end() || *it != off) continue;
      const W value = values[static_cast<std::size_t>(it - active.begin())];
      W& out = expected[static_cast<std::size_t>(&dst[i] - buffer.data())];
      out = enc == encoding::xor_mask ? static_cast<W>(out ^ value) : value;
      ++expected_writes;
    }

    const std::vector<W> before = buffer;
    delta_sink<W> sink;
    sink.begin(t, scratch.data(), active, values, enc, delta_pass::check);
    sink.copy(dst, src);
    const auto checked = sink.finish();
    CHECK(checked.elements == expected_writes);
    CHECK(buffer == before);  // the check pass never writes
    sink.begin(t, scratch.data(), active, values, enc, delta_pass::write);
    sink.copy(dst, src);
    const auto written = sink.finish();
    CHECK(written.elements == expected_writes);
    CHECK(written.copies == 1);
    CHECK(buffer == expected);
  }
}

}  // namespace

TEST_CASE("delta_sink inverts every strided view exactly (random views, both encodings)") {
  check_random_views<std::uint16_t>(1);
  check_random_views<std::uint32_t>(2);
  check_random_views<std::uint8_t>(3);
  check_random_views<std::uint64_t>(4);
}

TEST_CASE("the check pass writes nothing") {
  const dcr::canonical_tensor t{"w", dcr::dtype::bf16, {4, 4}};
  std::vector<std::uint16_t> scratch(16, 0), out(16, 0x1234);
  const std::vector<std::uint64_t> active{0, 5, 15};
  const std::vector<std::uint16_t> values{1, 2, 3};
  delta_sink<std::uint16_t> sink;
  sink.begin(t, scratch.data(), active, values, encoding::overwrite, delta_pass::check);
  sink.copy(tensor_view<std::uint16_t>::contiguous(out.data(), {4, 4}),
            tensor_view<const std::uint16_t>::contiguous(scratch.data(), {4, 4}));
  CHECK(sink.finish().elements == 3);
  CHECK(std::all_of(out.begin(), out.end(), [](auto w) { return w == 0x1234; }));
}

TEST_CASE("special bit patterns are applied exactly: -0, NaN payloads, infinities, subnormals") {
  const dcr::canonical_tensor t{"w", dcr::dtype::bf16, {8}};
  std::vector<std::uint16_t> scratch(8, 0);
  // old -> new: +0 -> -0, NaN payload -> other NaN payload, sNaN -> qNaN, inf -> -inf,
  // subnormal -> -subnormal, -0 -> +0, NaN -> 0, 0 -> NaN.
  const std::vector<std::uint16_t> old_bits{0x0000, 0x7fc1, 0x7f81, 0x7f80, 0x0001, 0x8000, 0xffa5, 0x0000};
  const std::vector<std::uint16_t> new_bits{0x8000, 0x7fc2, 0x7fc0, 0xff80, 0x8001, 0x0000, 0x0000, 0xffa5};
  std::vector<std::uint64_t> active(8);
  std::iota(active.begin(), active.end(), 0);
  for (auto enc : {encoding::overwrite, encoding::xor_mask}) {
    std::vector<std::uint16_t> values(8), storage = old_bits;
    for (std::size_t i = 0; i < 8; ++i)
      values[i] = enc == encoding::xor_mask ? static_cast<std::uint16_t>(old_bits[i] ^ new_bits[i])
                                            : new_bits[i];
    delta_sink<std::uint16_t> sink;
    for (auto pass : {delta_pass::check, delta_pass::write}) {
      sink.begin(t, scratch.data(), active, values, enc, pass);
      sink.copy(tensor_view<std::uint16_t>::contiguous(storage.data(), {8}),
                tensor_view<const std::uint16_t>::contiguous(scratch.data(), {8}));
      sink.finish();
    }
    CHECK(storage == new_bits);
  }
}

TEST_CASE("delta_sink rejects src views it cannot locate by address") {
  const dcr::canonical_tensor t{"model.w", dcr::dtype::bf16, {3, 4}};
  std::vector<std::uint16_t> scratch(12, 0), out(12, 0), temp(12, 0);
  const std::vector<std::uint64_t> active{1, 6};
  const std::vector<std::uint16_t> values{7, 8};
  auto whole = tensor_view<const std::uint16_t>::contiguous(scratch.data(), {3, 4});
  auto dst = tensor_view<std::uint16_t>::contiguous(out.data(), {3, 4});
  auto attempt = [&](tensor_view<std::uint16_t> d, tensor_view<const std::uint16_t> s) {
    return code_of([&] {
      delta_sink<std::uint16_t> sink;
      sink.begin(t, scratch.data(), active, values, encoding::xor_mask, delta_pass::check);
      sink.copy(d, s);
      sink.finish();
    });
  };
  CHECK(attempt(dst, whole) == errc::ok);
  // A temporary holding the same words.
  CHECK(attempt(dst, tensor_view<const std::uint16_t>::contiguous(temp.data(), {3, 4})) ==
        errc::unsupported_loader_path);
  // Starts inside, runs past the end of the tensor.
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {4}),
                tensor_view<const std::uint16_t>::contiguous(scratch.data() + 10, {4})) ==
        errc::unsupported_loader_path);
  // Reversed view whose lowest address lies before the tensor.
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {3}),
                tensor_view<const std::uint16_t>(scratch.data() + 1, 1, {3}, {-1})) ==
        errc::unsupported_loader_path);
  // Broadcast (stride 0): one canonical element would feed several destinations of one copy.
  CHECK(attempt(dst, tensor_view<const std::uint16_t>(scratch.data(), 2, {3, 4}, {0, 1})) ==
        errc::unsupported_loader_path);
  // Interleaved strides (offsets 0,3,2,5,4,7 are distinct but not a nested layout).
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {3, 2}),
                tensor_view<const std::uint16_t>(scratch.data(), 2, {3, 2}, {2, 3})) ==
        errc::unsupported_loader_path);
  // Not aligned to a word of the scratch.
  const auto* misaligned = reinterpret_cast<const std::uint16_t*>(
      reinterpret_cast<const std::byte*>(scratch.data()) + 1);
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {2}),
                tensor_view<const std::uint16_t>::contiguous(misaligned, {2})) ==
        errc::unsupported_loader_path);
  // dst and src shapes differ.
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {4, 3}), whole) ==
        errc::shape_mismatch);
  // Empty views are copies of nothing, wherever they point.
  CHECK(attempt(tensor_view<std::uint16_t>::contiguous(out.data(), {0, 4}),
                tensor_view<const std::uint16_t>::contiguous(temp.data(), {0, 4})) == errc::ok);
  CHECK(std::all_of(out.begin(), out.end(), [](auto w) { return w == 0; }));
  // The message names the tensor.
  try {
    delta_sink<std::uint16_t> sink;
    sink.begin(t, scratch.data(), active, values, encoding::overwrite, delta_pass::check);
    sink.copy(dst, tensor_view<const std::uint16_t>::contiguous(temp.data(), {3, 4}));
    FAIL("expected an error");
  } catch (const dcr::error& e) {
    CHECK(std::string(e.what()).find("model.w") != std::string::npos);
  }
}

TEST_CASE("xor items: replication to distinct destinations is fine, a repeated destination is not") {
  const dcr::canonical_tensor t{"norm", dcr::dtype::f32, {4}};
  std::vector<std::uint32_t> scratch(4, 0), a(4, 0), b(4, 0);
  const std::vector<std::uint64_t> active{2};
  const std::vector<std::uint32_t> values{0x80000000u};
  auto src = tensor_view<const std::uint32_t>::contiguous(scratch.data(), {4});
  auto da = tensor_view<std::uint32_t>::contiguous(a.data(), {4});
  auto db = tensor_view<std::uint32_t>::contiguous(b.data(), {4});
  auto run = [&](encoding enc, std::vector<tensor_view<std::uint32_t>> dsts,
                 tensor_view<const std::uint32_t> s) {
    return code_of([&] {
      delta_sink<std::uint32_t> sink;
      sink.begin(t, scratch.data(), active, values, enc, delta_pass::check);
      for (auto d : dsts) sink.copy(d, s);
      sink.finish();
    });
  };
  CHECK(run(encoding::xor_mask, {da, db}, src) == errc::ok);
  CHECK(run(encoding::xor_mask, {da, da}, src) == errc::unsupported_loader_path);
  CHECK(run(encoding::overwrite, {da, da}, src) == errc::ok);  // idempotent: last write wins
  // One copy whose dst overlaps itself (stride 0): two source elements land on one word.
  const std::vector<std::uint64_t> two{1, 2};
  const std::vector<std::uint32_t> two_values{1, 2};
  auto collapsed = tensor_view<std::uint32_t>(a.data(), 1, {4}, {0});
  CHECK(code_of([&] {
          delta_sink<std::uint32_t> sink;
          sink.begin(t, scratch.data(), two, two_values, encoding::xor_mask, delta_pass::check);
          sink.copy(collapsed, src);
          sink.finish();
        }) == errc::unsupported_loader_path);
  // With a single active element it writes one word once: exact, accepted.
  CHECK(run(encoding::xor_mask, {collapsed}, src) == errc::ok);
}

TEST_CASE("copy/skip accounting: every load copies or skips, never both, never neither") {
  const dcr::canonical_tensor t{"experts.3.w", dcr::dtype::bf16, {2}};
  const dcr::canonical_tensor other{"experts.4.w", dcr::dtype::bf16, {2}};
  std::vector<std::uint16_t> scratch(2, 0), out(2, 0);
  auto src = tensor_view<const std::uint16_t>::contiguous(scratch.data(), {2});
  auto dst = tensor_view<std::uint16_t>::contiguous(out.data(), {2});
  auto run = [&](auto body) {
    return code_of([&] {
      delta_sink<std::uint16_t> sink;
      sink.begin(t, scratch.data(), {}, {}, encoding::overwrite, delta_pass::check);
      body(sink);
      sink.finish();
    });
  };
  CHECK(run([&](auto& s) { s.skip(t); }) == errc::ok);
  CHECK(run([&](auto& s) { s.copy(dst, src); }) == errc::ok);
  CHECK(run([&](auto&) {}) == errc::unsupported_loader_path);
  CHECK(run([&](auto& s) { s.copy(dst, src); s.skip(t); }) == errc::unsupported_loader_path);
  CHECK(run([&](auto& s) { s.skip(t); s.copy(dst, src); }) == errc::unsupported_loader_path);
  CHECK(run([&](auto& s) { s.skip(other); }) == errc::unsupported_loader_path);
  CHECK(code_of([&] {
          delta_sink<std::uint16_t> sink;
          sink.begin(t, scratch.data(), {}, {}, static_cast<encoding>(9), delta_pass::check);
        }) == errc::unsupported_version);
}

TEST_CASE("dense_sink copies every element and logs what each load did") {
  const dcr::canonical_tensor a{"a", dcr::dtype::bf16, {2, 3}};
  const dcr::canonical_tensor b{"b", dcr::dtype::bf16, {2}};
  std::vector<std::uint16_t> src{1, 2, 3, 4, 5, 6}, out(6, 0);
  dcr::dense_sink<std::uint16_t> sink;
  auto s = tensor_view<const std::uint16_t>::contiguous(src.data(), {2, 3});
  auto d = tensor_view<std::uint16_t>::contiguous(out.data(), {3, 2});
  sink.begin(a);
  sink.copy(d.transpose(0, 1), s);
  auto r = sink.finish();
  CHECK(r.copies == 1);
  CHECK(r.elements == 6);
  CHECK_FALSE(r.skipped);
  CHECK(out == std::vector<std::uint16_t>{1, 4, 2, 5, 3, 6});
  sink.begin(b);
  sink.skip(b);
  sink.finish();
  REQUIRE(sink.log().size() == 2);
  CHECK(sink.log()[0].tensor == "a");
  CHECK(sink.log()[1].tensor == "b");
  CHECK(sink.log()[1].skipped);
  sink.begin(b);
  CHECK_THROWS_AS(sink.finish(), dcr::error);
  sink.begin(a);
  CHECK_THROWS_AS(sink.copy(d, s), dcr::error);  // [3,2] vs [2,3]
}

namespace {
struct untagged_loader {
  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor&, tensor_view<const W>, Sink&) {}
};
struct dense_only_loader {
  using loader_concept = dcr::loader_tag;
  template <dcr::storage_word W>
  void load(const dcr::canonical_tensor&, tensor_view<const W>, dcr::dense_sink<W>&) {}
};
}  // namespace

TEST_CASE("loader concept: opt-in tag and a load() generic over the sink") {
  static_assert(dcr::loader<dcr_test::test_engine_loader>);
  static_assert(!dcr::loader_for<untagged_loader, std::uint16_t>);
  static_assert(!dcr::loader_for<dense_only_loader, std::uint16_t>);
  static_assert(dcr::sink_for<dcr::delta_sink<std::uint32_t>, std::uint32_t>);
  static_assert(!dcr::sink_for<dcr::delta_sink<std::uint32_t>, std::uint16_t>);
  CHECK(true);
}
