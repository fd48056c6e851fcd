// Stream codings (codec/streams.hpp): zigzag, bucket sequences, packed bits, every location and
// value coding written and read back for every word width, and every reader's refusal of a
// malformed stream, checked against the documented formulas rather than the implementation's.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../error_capture.hpp"
#include "dcr/codec/streams.hpp"
#include "dcr/detail/bitpack.hpp"
#include "dcr/detail/huffman.hpp"
#include "reference.hpp"

namespace {

using dcr::errc;
using dcr::location_coding;
using dcr::value_coding;
using namespace dcr_test;
namespace d = dcr::detail;

const auto where = [] { return std::string("test"); };

using dcr_test::code_of;
using dcr_test::message_of;

template <class W>
std::vector<W> special_words(std::mt19937_64& rng, std::size_t n) {
  const std::uint64_t specials[] = {0,
                                    1,
                                    0x8000800080008000ull,
                                    0x7f807f807f807f80ull,
                                    0x7fc17fc17fc17fc1ull,
                                    0x0001000100010001ull,
                                    0x8001800180018001ull,
                                    ~0ull,
                                    ~0ull >> 1,
                                    0x7fffffffffffffffull,
                                    0x8000000000000000ull};
  std::vector<W> out(n);
  for (auto& x : out) {
    const unsigned r = rng() % 8;
    x = r < 3   ? static_cast<W>(specials[rng() % 11])
        : r < 6 ? static_cast<W>(static_cast<std::int64_t>(rng() % 17) - 8)  // small signed
                : static_cast<W>(rng());
  }
  return out;
}

bytes_t as_bytes(const d::raw_stream& r) { return {r.bytes().begin(), r.bytes().end()}; }

}  // namespace

// ======================================================================= transforms

TEST_CASE("zigzag: a bijection that maps small signed values to small magnitudes") {
  for (unsigned v = 0; v < 256; ++v) {
    const auto z = d::zigzag_encode<std::uint8_t>(static_cast<std::uint8_t>(v));
    CHECK(z == ref_zigzag<std::uint8_t>(static_cast<std::uint8_t>(v)));
    CHECK(d::zigzag_decode<std::uint8_t>(z) == v);
  }
  for (unsigned v = 0; v < 65536; ++v) {
    const auto z = d::zigzag_encode<std::uint16_t>(static_cast<std::uint16_t>(v));
    REQUIRE(d::zigzag_decode<std::uint16_t>(z) == v);
  }
  static_assert(d::zigzag_encode<std::uint16_t>(0xffff) == 1);  // -1
  static_assert(d::zigzag_encode<std::uint16_t>(1) == 2);
  static_assert(d::zigzag_encode<std::uint32_t>(0x80000000u) == 0xffffffffu);  // INT_MIN
  static_assert(d::zigzag_encode<std::uint64_t>(0x7fffffffffffffffull) == ~1ull);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t v = rng();
    REQUIRE(d::zigzag_decode<std::uint64_t>(d::zigzag_encode<std::uint64_t>(v)) == v);
    REQUIRE(d::zigzag_encode<std::uint64_t>(v) == ref_zigzag<std::uint64_t>(v));
    const auto v32 = static_cast<std::uint32_t>(v);
    REQUIRE(d::zigzag_decode<std::uint32_t>(d::zigzag_encode<std::uint32_t>(v32)) == v32);
  }
}

TEST_CASE("buckets: symbols follow the documented formula and the table inverts them") {
  std::mt19937_64 rng(9);
  for (unsigned m = 0; m <= 7; ++m) {
    CAPTURE(m);
    const unsigned width = d::bucket_max_width(m);
    const d::bucket_table table(m, width);
    std::vector<std::uint64_t> values = {0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 32, 255};
    for (unsigned len = 1; len <= width; ++len) {
      values.push_back(std::uint64_t{1} << (len - 1));
      values.push_back(len == 64 ? ~0ull : (std::uint64_t{1} << len) - 1);
      for (int k = 0; k < 8; ++k)
        values.push_back((rng() & (len == 64 ? ~0ull : (std::uint64_t{1} << len) - 1)) |
                         (std::uint64_t{1} << (len - 1)));
    }
    for (const std::uint64_t v : values) {
      if (bit_length(v) > width) continue;
      const d::bucket_code c = d::bucket_of(v, m);
      const bytes_t ref = ref_buckets({v}, m);
      REQUIRE(c.symbol == std::to_integer<unsigned>(ref[1]));
      REQUIRE(table.extra_bits[c.symbol] == c.extra_bits);
      REQUIRE((table.base[c.symbol] | c.extra) == v);
    }
    // Symbols past the width are marked invalid; every valid one decodes to its own bucket.
    for (unsigned s = 0; s < 256; ++s) {
      if (table.extra_bits[s] == d::bucket_table::invalid) continue;
      REQUIRE(d::bucket_of(table.base[s], m).symbol == s);
    }
  }
  CHECK(d::bucket_max_width(0) == 64);
  CHECK(d::bucket_max_width(2) == 64);
  CHECK(d::bucket_max_width(3) == 34);
  CHECK(d::bucket_max_width(4) == 19);
  CHECK(d::bucket_max_width(7) == 8);
  // A 16-bit width leaves symbols of longer lengths invalid.
  const d::bucket_table t16(3, 16);
  CHECK(t16.extra_bits[d::bucket_of(0xffff, 3).symbol] == 12);
  CHECK(t16.extra_bits[d::bucket_of(0x1ffff, 3).symbol] == d::bucket_table::invalid);
}

TEST_CASE("bit packing: fields of 0 to 64 bits round-trip, least significant bit first") {
  std::mt19937_64 rng(17);
  std::vector<std::pair<std::uint64_t, unsigned>> fields;
  std::uint64_t total = 0;
  for (int i = 0; i < 5000; ++i) {
    const unsigned k = static_cast<unsigned>(rng() % 65);
    const std::uint64_t v = k == 64 ? rng() : rng() & ((std::uint64_t{1} << k) - 1);
    fields.emplace_back(v, k);
    total += k;
  }
  bytes_t buf(d::packed_bytes(total) + d::bit_writer::slack, std::byte{0xee});
  d::bit_writer w(buf.data());
  ref_bits ref;
  for (auto [v, k] : fields) {
    w.put(v, k);
    ref.put(v, k);
  }
  const std::byte* end = w.finish();
  REQUIRE(static_cast<std::uint64_t>(end - buf.data()) == d::packed_bytes(total));
  const bytes_t want = ref.bytes();
  CHECK(bytes_t(buf.data(), buf.data() + (end - buf.data())) == want);
  d::bit_reader r(buf.data(), end);
  for (auto [v, k] : fields) REQUIRE(r.get(k) == v);
  // Reading past the end gives zeros, never bytes beyond it.
  d::bit_reader past(want.data(), want.data());
  CHECK(past.get(64) == 0);
}

// ======================================================================= locations

TEST_CASE("locations: every coding writes the documented bytes and reads back its indices") {
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::uint64_t>> sets = {
      {}, {0}, {99}, {0, 1, 2, 3}, {5, 6, 7, 11}, {0, 99}, {3, 4, 5, 50, 51, 97, 98, 99}};
  {
    std::vector<std::uint64_t> dense(100);
    for (std::uint64_t i = 0; i < 100; ++i) dense[i] = i;
    sets.push_back(dense);
    std::vector<std::uint64_t> sparse, clustered;
    for (std::uint64_t i = 0; i < 100; ++i)
      if (rng() % 4 == 0) sparse.push_back(i);
    for (std::uint64_t i = 0; i < 100; ++i)
      if ((i / 10) % 2 == 0 || rng() % 7 == 0) clustered.push_back(i);
    sets.push_back(sparse);
    sets.push_back(clustered);
  }
  d::raw_stream raw;
  bytes_t scratch, runs_scratch;
  for (const auto& idx : sets) {
    for (auto c : {location_coding::skip_varint, location_coding::skip_buckets,
                   location_coding::bitmap, location_coding::runs}) {
      for (unsigned m = 0; m <= 4; ++m) {
        CAPTURE(static_cast<int>(c));
        CAPTURE(m);
        CAPTURE(idx.size());
        d::write_locations(raw, scratch, runs_scratch, idx, c, m, d::count_runs(idx));
        const bytes_t want = ref_locations(idx, c, m);
        REQUIRE(as_bytes(raw) == want);
        CHECK(d::location_raw_size_plausible(c, want.size(), idx.size(), 100));
        std::vector<std::uint64_t> got(idx.size());
        d::read_locations(c, want, idx.size(), 100, got.data(), where);
        CHECK(got == idx);
      }
    }
  }
}

TEST_CASE("locations: large indices and skips round-trip in every coding") {
  const std::uint64_t numel = std::uint64_t{1} << 40;
  const std::vector<std::uint64_t> idx = {0,           1,           (1ull << 20) + 5, 1ull << 33,
                                          (1ull << 33) + 1, numel - 2, numel - 1};
  d::raw_stream raw;
  bytes_t scratch, runs_scratch;
  for (auto c : {location_coding::skip_varint, location_coding::skip_buckets, location_coding::runs}) {
    for (unsigned m : {0u, 2u}) {
      d::write_locations(raw, scratch, runs_scratch, idx, c, m, d::count_runs(idx));
      REQUIRE(as_bytes(raw) == ref_locations(idx, c, m));
      std::vector<std::uint64_t> got(idx.size());
      d::read_locations(c, raw.bytes(), idx.size(), numel, got.data(), where);
      CHECK(got == idx);
    }
  }
  // The whole 2^64 range: a skip of 2^64 - 1 needs the 64-bit symbols of M <= 2.
  const std::vector<std::uint64_t> top = {~0ull - 1};
  d::write_locations(raw, scratch, runs_scratch, top, location_coding::skip_buckets, 2, 1);
  std::vector<std::uint64_t> got(1);
  d::read_locations(location_coding::skip_buckets, raw.bytes(), 1, ~0ull, got.data(), where);
  CHECK(got == top);
}

TEST_CASE("locations: sections mark where symbols, lengths and extra bits start") {
  std::vector<std::uint64_t> idx;
  for (std::uint64_t i = 0; i < 5000; ++i) idx.push_back(i * 3 + (i % 7 == 0 ? 1 : 0));
  d::raw_stream raw;
  bytes_t scratch, runs_scratch;
  d::write_locations(raw, scratch, runs_scratch, idx, location_coding::skip_buckets, 1, 0);
  REQUIRE(raw.sections().size() == 1);
  CHECK(raw.sections()[0] == 1 + idx.size());  // extra bits after header and symbols
  d::write_locations(raw, scratch, runs_scratch, idx, location_coding::runs, 1, d::count_runs(idx));
  REQUIRE(raw.sections().size() == 2);  // run lengths' symbols, then extra bits
  const std::size_t runs = d::count_runs(idx);
  CHECK(raw.sections()[0] == d::varint_size(runs) + 1 + runs);
  CHECK(raw.sections()[1] == d::varint_size(runs) + 1 + 2 * runs);
}

namespace {
errc read_loc(location_coding c, const bytes_t& raw, std::uint64_t count, std::uint64_t numel) {
  std::vector<std::uint64_t> out(count);
  return code_of([&] { d::read_locations(c, raw, count, numel, out.data(), where); });
}
bytes_t cat(bytes_t a, const bytes_t& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
bytes_t B(std::initializer_list<unsigned> v) {
  bytes_t out;
  for (auto x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}
}  // namespace

TEST_CASE("locations: skip_buckets refuses malformed streams") {
  using enum location_coding;
  // skips 0, 97 with M = 2: index 0 and 98.
  const bytes_t good = ref_buckets({0, 97}, 2);
  CHECK(read_loc(skip_buckets, good, 2, 100) == errc::ok);
  CHECK(read_loc(skip_buckets, good, 2, 98) == errc::out_of_range);  // index 98 >= numel
  bytes_t b = good;
  b[0] = std::byte{0x0a};  // reserved header bit 3
  CHECK(read_loc(skip_buckets, b, 2, 100) == errc::reserved_bits_set);
  // Extra-bit section one byte long and one byte short.
  CHECK(read_loc(skip_buckets, cat(good, B({0})), 2, 100) == errc::corrupt_payload);
  b = good;
  b.pop_back();
  CHECK(read_loc(skip_buckets, b, 2, 100) == errc::corrupt_payload);
  // Nonzero padding bits after the extra bits (97 = 0b1100001 has 4 extra bits with M = 2).
  b = good;
  b.back() |= std::byte{0x80};
  CHECK(read_loc(skip_buckets, b, 2, 100) == errc::reserved_bits_set);
  // Fewer bytes than header + symbols.
  CHECK(read_loc(skip_buckets, B({2, 0}), 2, 100) == errc::corrupt_payload);
  CHECK(read_loc(skip_buckets, B({}), 0, 100) == errc::corrupt_payload);
  // A symbol meaning more than 64 bits (M = 0: symbol 2 + (65 - 2) = 65).
  CHECK(read_loc(skip_buckets, B({0, 65}), 1, 100) == errc::corrupt_payload);
  CHECK(message_of([&] {
          std::vector<std::uint64_t> out(1);
          d::read_locations(skip_buckets, B({0, 65}), 1, 100, out.data(), where);
        }).find("symbol 65 of entry 0") != std::string::npos);
  // A skip that overflows 2^64 when added is out_of_range, not a wrap.
  const bytes_t wrap = ref_buckets({5, ~0ull - 3}, 0);
  CHECK(read_loc(skip_buckets, wrap, 2, ~0ull) == errc::out_of_range);
}

TEST_CASE("locations: bitmap refuses malformed streams") {
  using enum location_coding;
  CHECK(read_loc(bitmap, B({0x05}), 2, 8) == errc::ok);
  CHECK(read_loc(bitmap, B({0x05}), 3, 8) == errc::corrupt_payload);       // popcount 2 != 3
  CHECK(read_loc(bitmap, B({0x05, 0x00}), 2, 16) == errc::corrupt_payload);  // trailing zero
  CHECK(read_loc(bitmap, B({0x05, 0x02}), 3, 9) == errc::out_of_range);    // bit 9 >= numel 9
  CHECK(read_loc(bitmap, B({0x05, 0x01}), 3, 9) == errc::ok);              // bit 8 < 9
  CHECK(read_loc(bitmap, B({0x01, 0x01}), 2, 8) == errc::out_of_range);    // 2 bytes for numel 8
  CHECK(read_loc(bitmap, B({}), 1, 8) == errc::corrupt_payload);           // empty, 1 record
  CHECK(read_loc(bitmap, B({}), 0, 8) == errc::ok);
  CHECK(read_loc(bitmap, B({}), 0, 0) == errc::ok);
  CHECK(message_of([&] {
          std::vector<std::uint64_t> out(3);
          d::read_locations(bitmap, B({0x05}), 3, 8, out.data(), where);
        }).find("2 bits set for 3 records") != std::string::npos);
  // Word-at-a-time decoding across 8-byte boundaries.
  bytes_t many(20, std::byte{0});
  std::vector<std::uint64_t> want;
  for (std::uint64_t i : {0u, 7u, 8u, 63u, 64u, 65u, 100u, 159u}) {
    many[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    want.push_back(i);
  }
  std::vector<std::uint64_t> got(want.size());
  d::read_locations(bitmap, many, want.size(), 160, got.data(), where);
  CHECK(got == want);
}

TEST_CASE("locations: runs refuses malformed streams") {
  constexpr auto runs = location_coding::runs;
  // Two runs: [2, 4] and [10, 10]: run count 2, skips 2, 5, lengths-1 2, 0.
  const auto runs_of = [](std::uint64_t count, std::vector<std::uint64_t> ints, unsigned m = 1) {
    bytes_t out;
    do {
      std::uint8_t b = count & 0x7f;
      count >>= 7;
      if (count != 0) b |= 0x80;
      out.push_back(static_cast<std::byte>(b));
    } while (count != 0);
    return cat(out, ref_buckets(ints, m));
  };
  CHECK(read_loc(runs, runs_of(2, {2, 5, 2, 0}), 4, 11) == errc::ok);
  {
    std::vector<std::uint64_t> got(4);
    d::read_locations(runs, runs_of(2, {2, 5, 2, 0}), 4, 11, got.data(), where);
    CHECK(got == std::vector<std::uint64_t>{2, 3, 4, 10});
  }
  CHECK(read_loc(runs, runs_of(2, {2, 5, 2, 0}), 4, 10) == errc::out_of_range);     // 10 >= numel
  CHECK(read_loc(runs, runs_of(2, {2, 0, 2, 0}), 4, 11) == errc::corrupt_payload);  // runs touch
  CHECK(read_loc(runs, runs_of(2, {2, 5, 2, 1}), 4, 20) == errc::corrupt_payload);  // 5 records
  CHECK(read_loc(runs, runs_of(2, {2, 5, 1, 0}), 4, 20) == errc::corrupt_payload);  // 3 records
  CHECK(read_loc(runs, runs_of(5, {0, 1, 1, 1, 1, 0, 0, 0, 0, 0}), 4, 20) == errc::corrupt_payload);
  CHECK(read_loc(runs, runs_of(0, {}), 1, 20) == errc::corrupt_payload);   // no runs, 1 record
  CHECK(read_loc(runs, runs_of(0, {}), 0, 20) == errc::ok);
  CHECK(read_loc(runs, runs_of(1, {0, 0}), 0, 20) == errc::corrupt_payload);  // a run, 0 records
  CHECK(read_loc(runs, runs_of(1, {0, 19}), 20, 20) == errc::ok);            // the whole tensor
  CHECK(read_loc(runs, runs_of(1, {1, 19}), 20, 20) == errc::out_of_range);  // one past the end
  CHECK(read_loc(runs, runs_of(1, {0, ~0ull}), 20, 20) == errc::out_of_range);
  CHECK(read_loc(runs, runs_of(1, {~0ull, 0}, 0), 1, 20) == errc::out_of_range);
  CHECK(read_loc(runs, B({0x80}), 0, 20) == errc::corrupt_payload);       // run count cut short
  CHECK(read_loc(runs, cat(runs_of(1, {0, 3}), B({0})), 4, 20) == errc::corrupt_payload);  // trailing
  bytes_t b = runs_of(2, {2, 5, 2, 0});
  b[1] = std::byte{0x21};  // reserved bucket header bits
  CHECK(read_loc(runs, b, 4, 11) == errc::reserved_bits_set);
}

TEST_CASE("locations: skip_varint keeps its version-1 checks") {
  using enum location_coding;
  CHECK(read_loc(skip_varint, B({0, 98}), 2, 100) == errc::ok);
  CHECK(read_loc(skip_varint, B({0, 99}), 2, 100) == errc::out_of_range);
  CHECK(read_loc(skip_varint, B({0x80, 0x00}), 1, 100) == errc::corrupt_payload);  // not minimal
  CHECK(read_loc(skip_varint, B({5, 0}), 1, 100) == errc::corrupt_payload);        // left over
}

TEST_CASE("locations: raw sizes are bounded by the record count before decompressing") {
  using enum location_coding;
  CHECK(d::location_raw_size_plausible(skip_varint, 4, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(skip_varint, 3, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(skip_varint, 9, 4, 100));  // 1 byte per skip < 128
  CHECK(d::location_raw_size_plausible(skip_buckets, 5, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(skip_buckets, 4, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(skip_buckets, 5 + 4, 4, 100));  // 4 * 6 bits at most
  CHECK(d::location_raw_size_plausible(bitmap, 13, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(bitmap, 14, 4, 100));  // beyond ceil(100 / 8)
  CHECK_FALSE(d::location_raw_size_plausible(bitmap, 0, 4, 100));
  CHECK_FALSE(d::location_raw_size_plausible(bitmap, 1, 9, 100));  // 8 bits cannot hold 9
  CHECK(d::location_raw_size_plausible(runs, 2, 0, 100));
  CHECK_FALSE(d::location_raw_size_plausible(runs, 1, 0, 100));
  CHECK_FALSE(d::location_raw_size_plausible(runs, 1000, 4, 100));
  CHECK(d::location_raw_bound(4) >= 1 + 4 * 10);
}

// ======================================================================= values

namespace {
template <class W>
void check_values_round_trip(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  d::raw_stream raw;
  bytes_t scratch;
  for (std::size_t n : {0u, 1u, 2u, 7u, 300u}) {
    const std::vector<W> words = special_words<W>(rng, n);
    W or_plain = 0, or_zig = 0;
    for (W w : words) {
      or_plain |= w;
      or_zig |= d::zigzag_encode<W>(w);
    }
    for (auto c : {value_coding::raw, value_coding::byte_planes, value_coding::zigzag_planes,
                   value_coding::buckets, value_coding::zigzag_buckets}) {
      for (unsigned m = 0; m <= 4; ++m) {
        const bool zig = d::is_zigzag_coding(c);
        const auto width = static_cast<unsigned>(std::bit_width(zig ? or_zig : or_plain));
        if (d::is_bucket_coding(c) && d::bucket_max_width(m) < width) continue;
        CAPTURE(sizeof(W));
        CAPTURE(n);
        CAPTURE(static_cast<int>(c));
        CAPTURE(m);
        d::write_values<W>(raw, scratch, reinterpret_cast<const std::byte*>(words.data()), n, c, m,
                           width);
        const bytes_t want = ref_values<W>(words, c, m);
        REQUIRE(as_bytes(raw) == want);
        CHECK(d::value_raw_size_plausible(c, want.size(), n, sizeof(W)));
        std::vector<W> got(n);
        d::read_values<W>(c, want, n, reinterpret_cast<std::byte*>(got.data()), where);
        CHECK(got == words);
      }
    }
  }
}
}  // namespace

TEST_CASE("values: every coding writes the documented bytes and reads back every word width") {
  check_values_round_trip<std::uint8_t>(1);
  check_values_round_trip<std::uint16_t>(2);
  check_values_round_trip<std::uint32_t>(3);
  check_values_round_trip<std::uint64_t>(4);
}

TEST_CASE("values: bucket streams refuse malformed content") {
  const auto read = [](value_coding c, const bytes_t& raw, std::size_t n) {
    std::vector<std::uint16_t> out(n);
    return code_of([&] {
      d::read_values<std::uint16_t>(c, raw, n, reinterpret_cast<std::byte*>(out.data()), where);
    });
  };
  const bytes_t good = ref_buckets({1, 300, 65535}, 3);
  CHECK(read(value_coding::buckets, good, 3) == errc::ok);
  CHECK(read(value_coding::zigzag_buckets, good, 3) == errc::ok);
  bytes_t b = good;
  b[0] = std::byte{0x83};
  CHECK(read(value_coding::buckets, b, 3) == errc::reserved_bits_set);
  CHECK(read(value_coding::buckets, cat(good, B({0})), 3) == errc::corrupt_payload);
  b = good;
  b.pop_back();
  CHECK(read(value_coding::buckets, b, 3) == errc::corrupt_payload);
  // A 17-bit value in a 16-bit word: valid for 64-bit locations, not for these words.
  CHECK(read(value_coding::buckets, ref_buckets({1u << 16}, 3), 1) == errc::corrupt_payload);
  // Padding bits: 300 has 5 extra bits with M = 3, 65535 has 12, together 17: one padding byte
  // holds bit 16 and seven padding bits.
  b = good;
  b.back() |= std::byte{0x02};
  CHECK(read(value_coding::buckets, b, 3) == errc::reserved_bits_set);
  CHECK(d::value_raw_size_plausible(value_coding::buckets, 4, 3, 2));
  CHECK_FALSE(d::value_raw_size_plausible(value_coding::buckets, 3, 3, 2));
  CHECK_FALSE(d::value_raw_size_plausible(value_coding::zigzag_buckets, 4 + 7, 3, 2));
  CHECK_FALSE(d::value_raw_size_plausible(value_coding::zigzag_planes, 5, 3, 2));
  CHECK(d::value_raw_bound(3, 2) >= 4 + 6);
}

// ======================================================================= estimates

TEST_CASE("estimates: the literal model tracks the Huffman code it stands for") {
  std::mt19937_64 rng(2);
  std::geometric_distribution<int> geo(0.15);
  std::array<std::uint64_t, 256> hist{};
  const std::uint64_t n = 100000;
  for (std::uint64_t i = 0; i < n; ++i) ++hist[std::min(geo(rng), 255)];
  std::array<std::uint8_t, 256> len{};
  d::huffman_lengths(hist, len);
  double huffman_bits = 0, kraft = 0;
  for (unsigned s = 0; s < 256; ++s) {
    huffman_bits += static_cast<double>(hist[s]) * len[s];
    if (len[s] != 0) kraft += std::ldexp(1.0, -len[s]);
    CHECK(len[s] <= d::huffman_max_bits);
  }
  CHECK(kraft <= 1.0);
  const double model = d::literal_cost(hist, n, n);
  CHECK(model == doctest::Approx(huffman_bits / 8).epsilon(0.05));
  // Sampled histograms scale; one repeated byte is nearly free; random bytes cost their size.
  CHECK(d::literal_cost(hist, n, 10 * n) == doctest::Approx(10 * model).epsilon(0.01));
  std::array<std::uint64_t, 256> one{};
  one[7] = n;
  CHECK(d::literal_cost(one, n, n) < 16);
  std::array<std::uint64_t, 256> flat{};
  flat.fill(n / 256);
  CHECK(d::literal_cost(flat, n / 256 * 256, n) == doctest::Approx(static_cast<double>(n)).epsilon(0.01));
  for (double x : {1.0, 1.5, 3.0, 1000.0, 123456.789})
    CHECK(d::fast_log2(x) == doctest::Approx(std::log2(x)).epsilon(1e-5));
}
