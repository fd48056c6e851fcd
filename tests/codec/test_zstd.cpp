// zstd context wrappers: frames are standard, sizes are exact, anything else is corrupt_payload.
#include <doctest/doctest.h>

#include <zstd.h>

#include <cstdint>
#include <random>
#include <vector>

#include "dcr/detail/zstd.hpp"

namespace {

using dcr::detail::zstd_compressor;
using dcr::detail::zstd_decompressor;

std::vector<std::byte> sample(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() % 7);  // compressible
  return v;
}

dcr::errc code_of(auto&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return dcr::errc::ok;
}

}  // namespace

TEST_CASE("zstd: frames are standard, record their content size and round-trip") {
  zstd_compressor c(1);
  zstd_decompressor d;
  for (std::size_t n : {0u, 1u, 1000u, 300000u}) {
    CAPTURE(n);
    const auto src = sample(n, n);
    std::vector<std::byte> frame = {std::byte{0xaa}};  // appends after what is there
    const std::size_t size = c.compress_append(src, frame);
    REQUIRE(frame.size() == 1 + size);
    const std::span<const std::byte> f = std::span<const std::byte>(frame).subspan(1);
    CHECK(ZSTD_getFrameContentSize(f.data(), f.size()) == n);
    std::vector<std::byte> plain(n + 1);
    CHECK(ZSTD_decompress(plain.data(), plain.size(), f.data(), f.size()) == n);
    plain.resize(n);
    CHECK(plain == src);
    std::vector<std::byte> back;
    d.decompress(f, n, back);
    CHECK(back == src);
  }
}

TEST_CASE("zstd: levels are checked and change only the size") {
  CHECK(code_of([] { zstd_compressor c(ZSTD_maxCLevel() + 1); }) == dcr::errc::invalid_argument);
  zstd_compressor c(1);
  const auto src = sample(100000, 3);
  std::vector<std::byte> fast, strong;
  c.compress_append(src, fast);
  c.set_level(19);
  CHECK(c.level() == 19);
  c.compress_append(src, strong);
  CHECK(strong.size() <= fast.size());
  zstd_decompressor d;
  std::vector<std::byte> back;
  d.decompress(strong, src.size(), back);
  CHECK(back == src);
}

TEST_CASE("zstd: forced block starts keep one standard frame and separate the statistics") {
  // Two sections of different statistics: small symbols, then near-uniform bytes.
  std::mt19937_64 rng(11);
  std::vector<std::byte> src(200000);
  for (std::size_t i = 0; i < 100000; ++i) src[i] = static_cast<std::byte>(rng() % 5);
  for (std::size_t i = 100000; i < src.size(); ++i) src[i] = static_cast<std::byte>(rng());
  zstd_compressor c(1);
  zstd_decompressor d;
  std::vector<std::size_t> breaks = {100000, 150000, 150001};
  std::vector<std::byte> frame(dcr::detail::zstd_sections_bound(src.size(), breaks.size()));
  const std::size_t n = c.compress(src, breaks, frame);
  frame.resize(n);
  CHECK(ZSTD_getFrameContentSize(frame.data(), frame.size()) == src.size());
  CHECK(ZSTD_findFrameCompressedSize(frame.data(), frame.size()) == n);  // exactly one frame
  std::vector<std::byte> back;
  d.decompress(frame, src.size(), back);
  CHECK(back == src);
  // Without breaks it is the one-call compression.
  std::vector<std::byte> one(dcr::detail::zstd_compress_bound(src.size())), plain;
  one.resize(c.compress(src, {}, one));
  c.compress_append(src, plain);
  CHECK(one == plain);
  // Empty sections at the ends are harmless.
  std::vector<std::byte> tiny(dcr::detail::zstd_sections_bound(3, 1));
  const std::vector<std::byte> three = {std::byte{1}, std::byte{2}, std::byte{3}};
  const std::vector<std::size_t> mid = {1};
  tiny.resize(c.compress(three, mid, tiny));
  d.decompress(tiny, 3, back);
  CHECK(back == three);
}

TEST_CASE("zstd: the hash table size is checked and changes only the size") {
  CHECK(code_of([] { zstd_compressor c(1, 1); }) == dcr::errc::invalid_argument);
  CHECK(code_of([] { zstd_compressor c(1, 99); }) == dcr::errc::invalid_argument);
  const auto src = sample(300000, 5);
  zstd_compressor small(1, 6), own(1, 0);
  std::vector<std::byte> a, b, back;
  small.compress_append(src, a);
  own.compress_append(src, b);
  zstd_decompressor d;
  d.decompress(a, src.size(), back);
  CHECK(back == src);
  d.decompress(b, src.size(), back);
  CHECK(back == src);
}

TEST_CASE("zstd: anything but one frame of exactly the expected size is corrupt_payload") {
  zstd_compressor c(1);
  zstd_decompressor d;
  const auto src = sample(5000, 9);
  std::vector<std::byte> frame;
  c.compress_append(src, frame);
  std::vector<std::byte> out;
  using dcr::errc;

  CHECK(code_of([&] { d.decompress(frame, src.size() - 1, out); }) == errc::corrupt_payload);
  CHECK(code_of([&] { d.decompress(frame, src.size() + 1, out); }) == errc::corrupt_payload);
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{8}, frame.size() - 1}) {
    CAPTURE(cut);
    CHECK(code_of([&] {
            d.decompress(std::span<const std::byte>(frame).first(cut), src.size(), out);
          }) == errc::corrupt_payload);
  }
  // Two frames back to back: plain ZSTD_decompress would accept them, the codec must not.
  std::vector<std::byte> two = frame;
  c.compress_append({}, two);
  CHECK(code_of([&] { d.decompress(two, src.size(), out); }) == errc::corrupt_payload);
  // A skippable frame carries no content.
  std::vector<std::byte> skippable(8 + 4);
  dcr::detail::store_le<std::uint32_t>(skippable.data(), ZSTD_MAGIC_SKIPPABLE_START);
  dcr::detail::store_le<std::uint32_t>(skippable.data() + 4, 4);
  CHECK(code_of([&] { d.decompress(skippable, 0, out); }) == errc::corrupt_payload);
  // A frame without a content size in its header.
  ZSTD_CCtx* raw = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(raw, ZSTD_c_contentSizeFlag, 0);
  std::vector<std::byte> unsized(ZSTD_compressBound(src.size()));
  ZSTD_inBuffer in{src.data(), src.size(), 0};
  ZSTD_outBuffer o{unsized.data(), unsized.size(), 0};
  REQUIRE(ZSTD_compressStream2(raw, &o, &in, ZSTD_e_end) == 0);
  ZSTD_freeCCtx(raw);
  unsized.resize(o.pos);
  REQUIRE(ZSTD_getFrameContentSize(unsized.data(), unsized.size()) == ZSTD_CONTENTSIZE_UNKNOWN);
  CHECK(code_of([&] { d.decompress(unsized, src.size(), out); }) == errc::corrupt_payload);
  // A block of the reserved type. (A frame without zstd's checksum does not catch every flipped
  // bit in a block body; the payload's XXH3 does.)
  std::vector<std::byte> bad = frame;
  const auto fhd = std::to_integer<unsigned>(frame[4]);
  const bool single = (fhd >> 5) & 1u;
  const std::size_t fcs_bytes[] = {single ? 1u : 0u, 2u, 4u, 8u};
  const std::size_t dict_bytes[] = {0u, 1u, 2u, 4u};
  const std::size_t block = 4 + 1 + (single ? 0 : 1) + dict_bytes[fhd & 3u] + fcs_bytes[fhd >> 6];
  bad[block] |= std::byte{0x06};  // Block_Type = 3 (reserved)
  CHECK(code_of([&] { d.decompress(bad, src.size(), out); }) == errc::corrupt_payload);
}

TEST_CASE("zstd: a frame claiming more than it can hold is refused before allocating") {
  // Single-segment frame header with an 8-byte content size of 2^40, then one last RLE block of 1
  // byte: consistent headers, hostile size.
  std::vector<std::byte> f(4 + 1 + 8 + 3 + 1);
  dcr::detail::store_le<std::uint32_t>(f.data(), ZSTD_MAGICNUMBER);
  f[4] = std::byte{0xe0};  // FCS flag 3 (8 bytes), single segment
  dcr::detail::store_le<std::uint64_t>(f.data() + 5, 1ull << 40);
  const std::uint32_t block = (1u << 3) | (1u << 1) | 1u;  // size 1, RLE, last
  f[13] = static_cast<std::byte>(block & 0xff);
  f[14] = static_cast<std::byte>((block >> 8) & 0xff);
  f[15] = static_cast<std::byte>(block >> 16);
  f[16] = std::byte{0x42};
  REQUIRE(ZSTD_getFrameContentSize(f.data(), f.size()) == (1ull << 40));
  const std::string why = zstd_decompressor::frame_error(f, 1ull << 40);
  CHECK(why.find("cannot decode") != std::string::npos);
  std::vector<std::byte> out;
  zstd_decompressor d;
  CHECK(code_of([&] { d.decompress(f, std::size_t{1} << 40, out); }) == dcr::errc::corrupt_payload);
  CHECK(out.capacity() == 0);
}
