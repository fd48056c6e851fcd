// LEB128 varints and little-endian words: the integer codings every payload field relies on.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "dcr/detail/varint.hpp"

namespace {

using dcr::detail::get_varint;
using dcr::detail::put_varint;
using dcr::detail::varint_size;

std::vector<std::byte> bytes_of(std::initializer_list<unsigned> v) {
  std::vector<std::byte> out;
  for (unsigned b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

bool decode_all(const std::vector<std::byte>& in, std::uint64_t& v) {
  const std::byte* p = in.data();
  return get_varint(p, in.data() + in.size(), v) && p == in.data() + in.size();
}

}  // namespace

TEST_CASE("varint: edge values round-trip with the documented sizes") {
  const std::array<std::uint64_t, 12> values = {0,
                                                1,
                                                127,
                                                128,
                                                16383,
                                                16384,
                                                (1ull << 35) - 1,
                                                1ull << 35,
                                                (1ull << 56),
                                                (1ull << 63) - 1,
                                                1ull << 63,
                                                ~0ull};
  const std::array<std::size_t, 12> sizes = {1, 1, 1, 2, 2, 3, 5, 6, 9, 9, 10, 10};
  for (std::size_t i = 0; i < values.size(); ++i) {
    CAPTURE(values[i]);
    std::array<std::byte, dcr::detail::varint_max_bytes> buf{};
    std::byte* end = put_varint(buf.data(), values[i]);
    CHECK(static_cast<std::size_t>(end - buf.data()) == sizes[i]);
    CHECK(varint_size(values[i]) == sizes[i]);
    const std::byte* p = buf.data();
    std::uint64_t back = 0;
    REQUIRE(get_varint(p, end, back));
    CHECK(p == end);
    CHECK(back == values[i]);
  }
}

TEST_CASE("varint: known encodings (LEB128, least significant group first)") {
  std::uint64_t v = 0;
  CHECK((decode_all(bytes_of({0x00}), v) && v == 0));
  CHECK((decode_all(bytes_of({0xac, 0x02}), v) && v == 300));
  CHECK((decode_all(bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), v) &&
         v == ~0ull));
}

TEST_CASE("varint: random values round-trip back to back") {
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> values(5000);
  for (auto& v : values) v = rng() >> (rng() % 64);
  std::vector<std::byte> buf(values.size() * dcr::detail::varint_max_bytes);
  std::byte* p = buf.data();
  for (auto v : values) p = put_varint(p, v);
  const std::byte* end = p;
  const std::byte* q = buf.data();
  for (auto v : values) {
    std::uint64_t back = 0;
    REQUIRE(get_varint(q, end, back));
    CHECK(back == v);
  }
  CHECK(q == end);
}

TEST_CASE("varint: overruns, over-long, overflowing and non-minimal encodings are refused") {
  std::uint64_t v = 0;
  CHECK_FALSE(decode_all({}, v));                // nothing to read
  CHECK_FALSE(decode_all(bytes_of({0x80}), v));  // continuation, then the end
  CHECK_FALSE(decode_all(bytes_of({0xff, 0xff, 0xff}), v));
  CHECK_FALSE(
      decode_all(bytes_of({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}),
                 v));  // 11 bytes
  CHECK_FALSE(decode_all(bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}),
                         v));                          // bit 64
  CHECK_FALSE(decode_all(bytes_of({0x80, 0x00}), v));  // 0 written in two bytes
  CHECK_FALSE(decode_all(bytes_of({0xac, 0x82, 0x00}), v));

  // The throwing form names the offset.
  const auto bad = bytes_of({0x01, 0x80});
  std::size_t pos = 0;
  CHECK(dcr::detail::read_varint(bad, pos, "test") == 1);
  CHECK(pos == 1);
  try {
    (void)dcr::detail::read_varint(bad, pos, "test");
    FAIL("no throw");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::corrupt_payload);
    CHECK(std::string(e.what()).find("byte 1") != std::string::npos);
  }
}

TEST_CASE("little-endian load/store is independent of host byte order") {
  std::array<std::byte, 8> buf{};
  dcr::detail::store_le<std::uint32_t>(buf.data(), 0x11223344u);
  CHECK(buf[0] == std::byte{0x44});
  CHECK(buf[3] == std::byte{0x11});
  CHECK(dcr::detail::load_le<std::uint32_t>(buf.data()) == 0x11223344u);
  dcr::detail::store_le<std::uint64_t>(buf.data(), 0x0102030405060708ull);
  CHECK(buf[0] == std::byte{0x08});
  CHECK(buf[7] == std::byte{0x01});
  CHECK(dcr::detail::load_le<std::uint16_t>(buf.data()) == 0x0708u);
}
