// Payload codec v1: round trips in every encoding, location coding and value coding, the byte
// layout of docs/format.md (checked against an independent reference writer), golden payloads,
// determinism, staging, allocation behaviour, and every decoder error.
#include <doctest/doctest.h>

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "../error_capture.hpp"
#include "dcr/codec/choose.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "reference.hpp"

// ---- Allocation counting: the codec promises no allocation once warm and no allocation sized by
// unvalidated fields. Counting is per thread and only while `alloc_probe` is alive.
namespace {
thread_local bool g_counting = false;
thread_local std::size_t g_allocs = 0;
thread_local std::size_t g_largest = 0;

void* counted_alloc(std::size_t n) {
  if (g_counting) {
    ++g_allocs;
    g_largest = std::max(g_largest, n);
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

struct alloc_probe {
  alloc_probe() {
    g_allocs = 0;
    g_largest = 0;
    g_counting = true;
  }
  ~alloc_probe() { g_counting = false; }
  [[nodiscard]] std::size_t count() const { return g_allocs; }
  [[nodiscard]] std::size_t largest() const { return g_largest; }
};
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace dcr {
inline std::ostream& operator<<(std::ostream& os, errc e) {
  return os << static_cast<int>(e) << " (" << make_error_code(e).message() << ")";
}
}  // namespace dcr

namespace {

using dcr::dtype;
using dcr::encoding;
using dcr::errc;
using dcr::item;

using bytes_t = std::vector<std::byte>;

dcr::tensor_registry make_registry() {
  return dcr::tensor_registry({
      {"a.bf16", dtype::bf16, {64, 33}},
      {"b.f16", dtype::f16, {100}},
      {"c.f32", dtype::f32, {7, 9}},
      {"d.f8", dtype::f8_e4m3, {300}},
      {"e.u8", dtype::u8, {50}},
      {"f.u64", dtype::u64, {40}},
      {"g.empty", dtype::bf16, {0}},
      {"h.huge", dtype::bf16, {1'000'000'000}},
  });
}

const dcr::tensor_registry& registry() {
  static const dcr::tensor_registry r = make_registry();
  return r;
}

dcr::payload_header make_header() {
  dcr::payload_header h;
  h.id = {.attempt = {.base_version = 41, .target_version = 42, .number = 3}, .owner = 17, .sequence = 5};
  h.registry_fingerprint = registry().fingerprint();
  return h;
}

using dcr_test::code_of;
using dcr_test::message_of;

enum class pattern { empty, first, last, dense, sparse };

// An item for tensor `name` whose values are random words mixed with float special patterns.
item random_item(const std::string& name, encoding enc, pattern pat, std::mt19937_64& rng) {
  const dcr::tensor_id id = registry().id(name);
  const auto& t = registry().at(id);
  const auto numel = static_cast<std::uint64_t>(t.numel());
  item it;
  it.tensor = id;
  it.type = t.type;
  it.enc = enc;
  switch (pat) {
    case pattern::empty: break;
    case pattern::first: it.indices = {0}; break;
    case pattern::last: it.indices = {numel - 1}; break;
    case pattern::dense:
      for (std::uint64_t i = 0; i < numel; ++i) it.indices.push_back(i);
      break;
    case pattern::sparse:
      it.indices.push_back(0);
      for (std::uint64_t i = 1; i + 1 < numel; ++i)
        if (rng() % 5 == 0) it.indices.push_back(i);
      it.indices.push_back(numel - 1);
      break;
  }
  it.values.resize(it.count() * it.word_bytes());
  const std::uint64_t specials[] = {0,
                                    0x8000800080008000ull,
                                    0x7f807f807f807f80ull,
                                    0x7fc17fc17fc17fc1ull,
                                    0x0001000100010001ull,
                                    ~0ull};
  for (std::size_t i = 0; i < it.values.size(); i += 8) {
    const std::uint64_t w = rng() % 4 == 0 ? specials[rng() % 6] : rng();
    std::memcpy(it.values.data() + i, &w, std::min<std::size_t>(8, it.values.size() - i));
  }
  return it;
}

void check_same(const std::vector<item>& got, const std::vector<item>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].tensor == want[i].tensor);
    CHECK(got[i].type == want[i].type);
    CHECK(got[i].enc == want[i].enc);
    CHECK(got[i].indices == want[i].indices);
    CHECK(got[i].values == want[i].values);
  }
}

bytes_t encode(const std::vector<item>& items, dcr::codec_options opt = {},
               const dcr::payload_header& h = make_header()) {
  dcr::payload_encoder enc(opt);
  bytes_t out;
  enc.encode(h, items, registry(), out);
  return out;
}

// ---- An independent writer of docs/format.md, for conformance and for crafting bad payloads.

void put(bytes_t& b, std::size_t off, std::uint64_t v, std::size_t n) {
  REQUIRE(off + n <= b.size());
  for (std::size_t k = 0; k < n; ++k) b[off + k] = static_cast<std::byte>(v >> (8 * k));
}
std::uint64_t get(const bytes_t& b, std::size_t off, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < n; ++k) v |= std::to_integer<std::uint64_t>(b[off + k]) << (8 * k);
  return v;
}
// Recomputes the checksum so that only the check under test can catch a patched field.
void reseal(bytes_t& b) { put(b, b.size() - 8, XXH3_64bits(b.data(), b.size() - 8), 8); }

void leb128(bytes_t& out, std::uint64_t v) {
  do {
    std::uint8_t byte = v & 0x7f;
    v >>= 7;
    if (v != 0) byte |= 0x80;
    out.push_back(static_cast<std::byte>(byte));
  } while (v != 0);
}

struct ref_entry {
  std::uint32_t tensor = 0;
  std::uint8_t dtype_code = 0, encoding_code = 0, location_code = 0, value_code = 0;
  std::uint64_t count = 0, numel = 0;
  bytes_t location_raw, value_raw;
  std::optional<bytes_t> location_frame;  // instead of compressing location_raw
};

ref_entry ref_from_item(const item& it, bool planes) {
  ref_entry e;
  e.tensor = it.tensor;
  e.dtype_code = static_cast<std::uint8_t>(it.type);
  e.encoding_code = static_cast<std::uint8_t>(it.enc);
  e.value_code = planes ? 1 : 0;
  e.count = it.count();
  e.numel = static_cast<std::uint64_t>(registry().at(it.tensor).numel());
  std::int64_t prev = -1;
  for (auto i : it.indices) {
    leb128(e.location_raw, i - static_cast<std::uint64_t>(prev) - 1);
    prev = static_cast<std::int64_t>(i);
  }
  const std::size_t w = it.word_bytes(), n = it.count();
  e.value_raw.resize(n * w);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < w; ++k)  // host is little-endian in these tests
      e.value_raw[planes ? k * n + i : i * w + k] = it.values[i * w + k];
  return e;
}

// The entry of `it` in any codings, through the reference writers of reference.hpp.
ref_entry ref_from_item(const item& it, dcr::location_coding lc, unsigned lm, dcr::value_coding vc,
                        unsigned vm) {
  ref_entry e = ref_from_item(it, true);
  e.location_code = static_cast<std::uint8_t>(lc);
  e.value_code = static_cast<std::uint8_t>(vc);
  e.location_raw = dcr_test::ref_locations(it.indices, lc, lm);
  dcr::visit_word(it.word_bytes(), [&]<class W>(W) {
    const auto w = it.words<W>();
    e.value_raw = dcr_test::ref_values<W>(std::vector<W>(w.begin(), w.end()), vc, vm);
  });
  return e;
}

bytes_t zstd1(const bytes_t& raw) {
  bytes_t f(ZSTD_compressBound(raw.size()));
  const std::size_t n = ZSTD_compress(f.data(), f.size(), raw.data(), raw.size(), 1);
  REQUIRE_FALSE(ZSTD_isError(n));
  f.resize(n);
  return f;
}

bytes_t ref_build(const dcr::payload_header& h, const std::vector<ref_entry>& entries) {
  bytes_t b(80 + 64 * entries.size());
  put(b, 0, 0x50524344, 4);  // "DCRP"
  put(b, 4, 1, 2);
  put(b, 8, 80, 2);
  put(b, 10, 64, 2);
  put(b, 16, h.registry_fingerprint, 8);
  put(b, 24, h.id.attempt.base_version, 8);
  put(b, 32, h.id.attempt.target_version, 8);
  put(b, 40, h.id.attempt.number, 4);
  put(b, 44, h.id.owner, 4);
  put(b, 48, h.id.sequence, 4);
  put(b, 52, entries.size(), 4);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ref_entry& e = entries[i];
    const bytes_t loc = e.location_frame ? *e.location_frame : zstd1(e.location_raw);
    const bytes_t val = zstd1(e.value_raw);
    const std::size_t p = 80 + 64 * i;
    put(b, p + 0, e.tensor, 4);
    put(b, p + 4, e.dtype_code, 1);
    put(b, p + 5, e.encoding_code, 1);
    put(b, p + 6, e.location_code, 1);
    put(b, p + 7, e.value_code, 1);
    put(b, p + 8, e.count, 8);
    put(b, p + 16, e.numel, 8);
    put(b, p + 24, loc.size(), 8);
    put(b, p + 32,
        e.location_frame ? ZSTD_getFrameContentSize(loc.data(), loc.size()) : e.location_raw.size(),
        8);
    put(b, p + 40, val.size(), 8);
    put(b, p + 48, e.value_raw.size(), 8);
    b.insert(b.end(), loc.begin(), loc.end());
    b.insert(b.end(), val.begin(), val.end());
  }
  b.resize(b.size() + 8);
  put(b, 56, b.size(), 8);
  reseal(b);
  return b;
}

// A small valid payload of two items, the base of most error tests.
std::vector<item> small_items() {
  std::mt19937_64 rng(5);
  return {random_item("b.f16", encoding::xor_mask, pattern::sparse, rng),
          random_item("e.u8", encoding::overwrite, pattern::first, rng)};
}

errc decode_code(const bytes_t& b, const dcr::attempt_key* expect = nullptr) {
  dcr::payload_decoder dec;
  std::vector<item> items;
  return code_of([&] { dec.decode(b, registry(), items, expect); });
}

}  // namespace

// ======================================================================= round trips

TEST_CASE("payload: round trip for every width, encoding, coding and index pattern") {
  const char* names[] = {"a.bf16", "b.f16", "c.f32", "d.f8", "e.u8", "f.u64"};
  std::mt19937_64 rng(1234);
  dcr::payload_decoder dec;
  std::vector<item> got;
  std::vector<dcr::codec_options> configs = {
      {.adaptive = false}, {.byte_planes = false, .adaptive = false}, {}, {.exact_choice = true}};
  for (auto lc : {dcr::location_coding::skip_varint, dcr::location_coding::skip_buckets,
                  dcr::location_coding::bitmap, dcr::location_coding::runs})
    for (auto vc : {dcr::value_coding::raw, dcr::value_coding::byte_planes,
                    dcr::value_coding::zigzag_planes, dcr::value_coding::buckets,
                    dcr::value_coding::zigzag_buckets})
      configs.push_back({.location = lc, .value = vc});
  for (std::size_t k = 0; k < configs.size(); ++k) {
    for (auto enc : {encoding::overwrite, encoding::xor_mask, encoding::ulp}) {
      for (auto pat :
           {pattern::empty, pattern::first, pattern::last, pattern::dense, pattern::sparse}) {
        CAPTURE(k);
        CAPTURE(static_cast<int>(enc));
        CAPTURE(static_cast<int>(pat));
        std::vector<item> items;
        for (const char* n : names) items.push_back(random_item(n, enc, pat, rng));
        std::shuffle(items.begin(), items.end(), rng);  // any item order is allowed
        const bytes_t payload = encode(items, configs[k]);
        CHECK(payload.size() <= dcr::payload_encoder::max_encoded_size(items));
        const dcr::payload_header h = dec.decode(payload, registry(), got);
        CHECK(h.id == make_header().id);
        CHECK(h.registry_fingerprint == registry().fingerprint());
        check_same(got, items);
      }
    }
  }
}

TEST_CASE("payload: property: random items in random codings round-trip") {
  std::mt19937_64 rng(2024);
  const char* names[] = {"a.bf16", "b.f16", "c.f32", "d.f8", "e.u8", "f.u64", "h.huge"};
  dcr::payload_decoder dec;
  std::vector<item> got;
  for (int round = 0; round < 60; ++round) {
    CAPTURE(round);
    std::vector<item> items;
    for (const char* name : names) {
      if (rng() % 3 == 0) continue;
      const dcr::tensor_id id = registry().id(name);
      const auto& t = registry().at(id);
      const auto numel = static_cast<std::uint64_t>(t.numel());
      item it;
      it.tensor = id;
      it.type = t.type;
      it.enc = static_cast<encoding>(rng() % 3);
      // Indices: runs, clusters and gaps of every size, up to the tensor's end.
      std::uint64_t i = rng() % 4 == 0 ? 0 : rng() % std::min<std::uint64_t>(numel, 1000);
      const std::size_t want = 1 + rng() % 600;
      while (i < numel && it.indices.size() < want) {
        it.indices.push_back(i);
        const unsigned kind = rng() % 4;
        i += kind == 0 ? 1 : kind == 1 ? 1 + rng() % 8 : kind == 2 ? 1 + rng() % 300
                                                                    : 1 + rng() % (numel / 16 + 1);
      }
      it.values.resize(it.count() * it.word_bytes());
      for (auto& b : it.values) b = static_cast<std::byte>(rng() % 5 == 0 ? rng() : rng() % 3);
      items.push_back(std::move(it));
    }
    dcr::codec_options o;
    if (rng() % 3 == 0) o.location = static_cast<dcr::location_coding>(rng() % 4);
    if (rng() % 3 == 0) o.value = static_cast<dcr::value_coding>(rng() % 5);
    o.exact_choice = rng() % 5 == 0;
    const bytes_t payload = encode(items, o);
    CHECK(payload.size() <= dcr::payload_encoder::max_encoded_size(items));
    dec.decode(payload, registry(), got);
    check_same(got, items);
  }
}

TEST_CASE("payload: empty payloads, empty tensors and a reused items vector") {
  dcr::payload_decoder dec;
  std::mt19937_64 rng(3);
  std::vector<item> got = {random_item("c.f32", encoding::overwrite, pattern::dense, rng)};

  const bytes_t none = encode({});
  CHECK(none.size() == 80 + 8);
  dec.decode(none, registry(), got);
  CHECK(got.empty());

  item empty;
  empty.tensor = registry().id("g.empty");
  empty.type = dtype::bf16;
  const std::vector<item> one = {empty};
  dec.decode(encode(one), registry(), got);
  check_same(got, one);
}

TEST_CASE("attempt keys and payload ids: one text spelling, read back exactly") {
  const dcr::attempt_key k{3, 4, 1};
  const dcr::payload_id id{k, 2, 5};
  CHECK(dcr::to_string(k) == "t3-4-a1");
  CHECK(dcr::to_string(id) == "t3-4-a1-o2-p5");
  CHECK(dcr::parse_attempt_key("t3-4-a1") == k);
  CHECK(dcr::parse_payload_id("t3-4-a1-o2-p5") == id);
  const dcr::payload_id extreme{{~0ull, ~0ull - 1, 0xffffffffu}, 0xffffffffu, 0};
  CHECK(dcr::parse_payload_id(dcr::to_string(extreme)) == extreme);
  CHECK(dcr::parse_attempt_key(dcr::to_string(extreme.attempt)) == extreme.attempt);
  // Anything to_string does not write is refused: other spellings, leading zeros, signs,
  // overflow, missing or extra parts.
  for (const char* bad : {"", "t3-4", "t3-4-a", "3-4-a1", "t3-4/a1", "t3-4-1", "t03-4-a1", "t3-4-a01",
                          "t+3-4-a1", "t3--4-a1", "t3-4-a1-", "t3-4-a1/", "t3-4-a1-o2-p5",
                          "t18446744073709551616-4-a1", "t3-4-a4294967296", "T3-4-a1"})
    CHECK_MESSAGE(!dcr::parse_attempt_key(bad).has_value(), bad);
  for (const char* bad : {"t3-4-a1", "t3-4-a1-o2", "t3-4-a1-p5-o2", "t3-4-a1-o2-p05", "t3-4-a1-o2-p5x",
                          "t3-4-a1-o4294967296-p5", "t3-4-a1-o2-p4294967296"})
    CHECK_MESSAGE(!dcr::parse_payload_id(bad).has_value(), bad);
  // An id's order is its attempt's, then owner, then sequence.
  CHECK(dcr::payload_id{{3, 4, 1}, 9, 9} < dcr::payload_id{{3, 4, 2}, 0, 0});
  CHECK(dcr::payload_id{{3, 4, 1}, 1, 9} < dcr::payload_id{{3, 4, 1}, 2, 0});
}

TEST_CASE("payload: header fields come back unchanged") {
  dcr::payload_header h = make_header();
  h.id = {.attempt = {.base_version = ~0ull, .target_version = 1ull << 40, .number = 0xffffffffu},
          .owner = 0x12345678u,
          .sequence = 0xfedcba98u};
  const bytes_t b = encode(small_items(), {}, h);
  CHECK(dcr::payload_decoder::peek_header(b).id == h.id);
  dcr::payload_decoder dec;
  std::vector<item> got;
  CHECK(dec.decode(b, registry(), got).id == h.id);
}

TEST_CASE("payload: a stream reader learns the total size from the header alone") {
  const bytes_t b = encode(small_items());
  const std::span<const std::byte> all(b);
  CHECK(dcr::payload_decoder::peek_size(all.first(80)) == b.size());
  CHECK(dcr::payload_decoder::peek_size(all.first(100)) == b.size());
  CHECK(code_of([&] { (void)dcr::payload_decoder::peek_size(all.first(79)); }) ==
        errc::truncated_payload);
  bytes_t v2 = b;
  put(v2, 4, 2, 2);
  CHECK(code_of([&] { (void)dcr::payload_decoder::peek_size(v2); }) == errc::unsupported_version);
}

TEST_CASE("payload: xor items applied to the old tensor give the new tensor bit for bit") {
  const auto id = registry().id("a.bf16");
  const std::size_t n = static_cast<std::size_t>(registry().at(id).numel());
  std::mt19937_64 rng(99);
  std::vector<std::uint16_t> old_t(n), new_t(n);
  for (std::size_t i = 0; i < n; ++i) {
    old_t[i] = static_cast<std::uint16_t>(rng());
    new_t[i] = rng() % 30 == 0 ? static_cast<std::uint16_t>(rng()) : old_t[i];
  }
  new_t[0] = old_t[0] ^ 0x8000u;  // sign flip only (e.g. +0 -> -0)
  std::vector<std::uint64_t> idx;
  std::vector<std::uint16_t> old_g, new_g;
  for (std::size_t i = 0; i < n; ++i)
    if (old_t[i] != new_t[i]) {
      idx.push_back(i);
      old_g.push_back(old_t[i]);
      new_g.push_back(new_t[i]);
    }
  for (auto enc : {encoding::xor_mask, encoding::overwrite}) {
    const std::vector<item> items = {
        dcr::make_item<std::uint16_t>(id, dtype::bf16, enc, idx, old_g, new_g)};
    dcr::payload_decoder dec;
    std::vector<item> got;
    dec.decode(encode(items), registry(), got);
    REQUIRE(got.size() == 1);
    std::vector<std::uint16_t> resident = old_t;
    const auto w = got[0].words<std::uint16_t>();
    for (std::size_t j = 0; j < got[0].count(); ++j) {
      auto& r = resident[got[0].indices[j]];
      r = enc == encoding::xor_mask ? dcr::xor_encoding::apply<std::uint16_t>(r, w[j])
                                    : dcr::overwrite_encoding::apply<std::uint16_t>(r, w[j]);
    }
    CHECK(resident == new_t);
  }
}

// ======================================================================= format conformance

TEST_CASE("format: the encoder writes exactly the bytes docs/format.md describes") {
  std::mt19937_64 rng(77);
  for (bool planes : {true, false}) {
    std::vector<item> items = {random_item("f.u64", encoding::xor_mask, pattern::sparse, rng),
                               random_item("a.bf16", encoding::overwrite, pattern::sparse, rng),
                               random_item("g.empty", encoding::xor_mask, pattern::empty, rng),
                               random_item("d.f8", encoding::overwrite, pattern::dense, rng)};
    std::vector<ref_entry> ref;
    for (const auto& it : items) ref.push_back(ref_from_item(it, planes));
    // Version-1 codings, each stream compressed in one call with level 1's own parameters: the
    // bytes of the first release.
    CHECK(encode(items, {.zstd_level = 1, .zstd_hash_log = 0, .byte_planes = planes,
                         .adaptive = false}) == ref_build(make_header(), ref));
  }
}

TEST_CASE("format: every coding's raw stream is the documented bytes") {
  std::mt19937_64 rng(78);
  std::vector<item> items = {random_item("f.u64", encoding::xor_mask, pattern::dense, rng),
                             random_item("a.bf16", encoding::ulp, pattern::sparse, rng),
                             random_item("d.f8", encoding::overwrite, pattern::dense, rng),
                             random_item("c.f32", encoding::ulp, pattern::dense, rng)};
  dcr::payload_decoder dec;
  std::vector<item> got;
  for (auto lc : {dcr::location_coding::skip_varint, dcr::location_coding::skip_buckets,
                  dcr::location_coding::bitmap, dcr::location_coding::runs}) {
    for (auto vc : {dcr::value_coding::raw, dcr::value_coding::byte_planes,
                    dcr::value_coding::zigzag_planes, dcr::value_coding::buckets,
                    dcr::value_coding::zigzag_buckets}) {
      CAPTURE(static_cast<int>(lc));
      CAPTURE(static_cast<int>(vc));
      const bytes_t b = encode(items, {.location = lc, .value = vc});
      std::vector<dcr::item_entry> table;
      dcr::payload_decoder::read_table(b, table);
      REQUIRE(table.size() == items.size());
      for (std::size_t i = 0; i < items.size(); ++i) {
        const auto& e = table[i];
        CHECK(e.value_code == static_cast<std::uint8_t>(vc));
        // The bucket parameter M is the encoder's choice: read it from the stream's first byte.
        bytes_t loc(e.location_raw_size), val(e.value_raw_size);
        REQUIRE(ZSTD_decompress(loc.data(), loc.size(), b.data() + e.location_offset,
                                e.location_size) == loc.size());
        REQUIRE(ZSTD_decompress(val.data(), val.size(), b.data() + e.value_offset,
                                e.value_size) == val.size());
        const auto lcode = static_cast<dcr::location_coding>(e.location_code);
        const unsigned lm =
            lcode == dcr::location_coding::skip_buckets ? std::to_integer<unsigned>(loc[0])
            : lcode == dcr::location_coding::runs
                ? std::to_integer<unsigned>(loc[dcr::detail::varint_size(
                      dcr::detail::count_runs(items[i].indices))])
                : 0;
        const unsigned vm = dcr::detail::is_bucket_coding(vc) ? std::to_integer<unsigned>(val[0]) : 0;
        const ref_entry ref = ref_from_item(items[i], lcode, lm, vc, vm);
        CHECK(loc == ref.location_raw);
        CHECK(val == ref.value_raw);
      }
      dec.decode(b, registry(), got);
      check_same(got, items);
    }
  }
}

TEST_CASE("format: payloads of the reference writer decode in every coding and M") {
  std::mt19937_64 rng(79);
  const std::vector<item> items = {random_item("b.f16", encoding::ulp, pattern::sparse, rng),
                                   random_item("f.u64", encoding::xor_mask, pattern::dense, rng),
                                   random_item("e.u8", encoding::overwrite, pattern::dense, rng),
                                   random_item("g.empty", encoding::ulp, pattern::empty, rng)};
  dcr::payload_decoder dec;
  std::vector<item> got;
  for (unsigned lc = 0; lc < 4; ++lc) {
    for (unsigned vc = 0; vc < 5; ++vc) {
      for (unsigned m = 0; m <= 7; ++m) {
        std::vector<ref_entry> ref;
        for (const auto& it : items) {
          // Bitmap and runs only where they suit (the format allows them anywhere).
          auto l = static_cast<dcr::location_coding>(lc);
          if (m > 2 && (l == dcr::location_coding::skip_buckets || l == dcr::location_coding::runs))
            continue;  // 64-bit skips need M <= 2 in general
          const unsigned width = 8 * static_cast<unsigned>(it.word_bytes());
          if (dcr::detail::is_bucket_coding(static_cast<dcr::value_coding>(vc)) &&
              dcr::detail::bucket_max_width(m) < width)
            continue;
          ref.push_back(ref_from_item(it, l, m, static_cast<dcr::value_coding>(vc), m));
        }
        if (ref.size() != items.size()) continue;
        CAPTURE(lc);
        CAPTURE(vc);
        CAPTURE(m);
        dec.decode(ref_build(make_header(), ref), registry(), got);
        check_same(got, items);
      }
    }
  }
}

TEST_CASE("format: streams are standard zstd frames at the offsets of the item table") {
  std::mt19937_64 rng(8);
  const std::vector<item> items = {random_item("c.f32", encoding::xor_mask, pattern::sparse, rng)};
  const bytes_t b = encode(items);
  std::vector<dcr::item_entry> table;
  dcr::payload_decoder::read_table(b, table);
  REQUIRE(table.size() == 1);
  const auto& e = table[0];
  CHECK(e.location_offset == 80 + 64);
  CHECK(e.value_offset == e.location_offset + e.location_size);
  CHECK(e.value_offset + e.value_size + 8 == b.size());

  bytes_t values(e.value_raw_size);
  const std::size_t n =
      ZSTD_decompress(values.data(), values.size(), b.data() + e.value_offset, e.value_size);
  REQUIRE(n == values.size());
  bytes_t locations(e.location_raw_size);
  CHECK(ZSTD_decompress(locations.data(), locations.size(), b.data() + e.location_offset,
                        e.location_size) == locations.size());
  const auto lc = static_cast<dcr::location_coding>(e.location_code);
  const auto vc = static_cast<dcr::value_coding>(e.value_code);
  const unsigned lm = lc == dcr::location_coding::skip_buckets ? std::to_integer<unsigned>(locations[0]) : 0;
  const unsigned vm = dcr::detail::is_bucket_coding(vc) ? std::to_integer<unsigned>(values[0]) : 0;
  CHECK(values == ref_from_item(items[0], lc, lm, vc, vm).value_raw);
  CHECK(locations == ref_from_item(items[0], lc, lm, vc, vm).location_raw);
}

TEST_CASE("format: a golden version-1 payload keeps decoding to the same items") {
  // Written once by this codec (zstd level 1, byte planes) for make_registry() and the header of
  // make_header(): b.f16 xor {0, 1, 7, 99} <- {0x8000, 0x0001, 0x7c00, 0x3c00} from zeros, and
  // c.f32 overwrite {62} <- {0x7fc00001}. Pins the layout; a decoder change that breaks it breaks
  // every payload in flight.
  const char* hex =
      "44435250010000005000400000000000cb975b7942fad3c02900000000000000"
      "2a00000000000000030000001100000005000000020000000d01000000000000"
      "0000000000000000000000000000000001000000020100010400000000000000"
      "64000000000000000d0000000000000004000000000000001100000000000000"
      "0800000000000000000000000000000002000000030000010100000000000000"
      "3f000000000000000a0000000000000001000000000000000d00000000000000"
      "0400000000000000000000000000000028b52ffd20042100000000055b28b52f"
      "fd20084100000001000080007c3c28b52ffd20010900003e28b52ffd20042100"
      "000100c07fd8964558648222ec";
  bytes_t golden;
  for (const char* p = hex; *p != 0; p += 2)
    golden.push_back(static_cast<std::byte>(std::stoul(std::string(p, 2), nullptr, 16)));
  REQUIRE(golden.size() == 269);

  const std::vector<std::uint64_t> i0 = {0, 1, 7, 99}, i1 = {62};
  const std::vector<std::uint16_t> z0(4), n0 = {0x8000, 0x0001, 0x7c00, 0x3c00};
  const std::vector<std::uint32_t> z1(1), n1 = {0x7fc00001u};
  const std::vector<item> want = {dcr::make_item<std::uint16_t>(registry().id("b.f16"), dtype::f16,
                                                                encoding::xor_mask, i0, z0, n0),
                                  dcr::make_item<std::uint32_t>(registry().id("c.f32"), dtype::f32,
                                                                encoding::overwrite, i1, z1, n1)};
  dcr::payload_decoder dec;
  std::vector<item> got;
  const dcr::payload_header h = dec.decode(golden, registry(), got);
  CHECK(h.id == make_header().id);
  check_same(got, want);
}

TEST_CASE("format: a golden payload in the newer codings keeps decoding to the same items") {
  // Written by the reference writer of this file (zstd level 1) for make_registry(): b.f16 ulp
  // {0, 1, 2, 3, 50, 98, 99} in runs (M = 1) with zigzag buckets (M = 2); d.f8 xor {0, 2, 3, 9,
  // 10, 11, 15} as a bitmap with buckets (M = 1); c.f32 ulp {5, 40} in skip buckets (M = 2) with
  // zigzag planes; f.u64 xor {39} in skip buckets (M = 0) with buckets (M = 0). docs/format.md
  // walks through its streams.
  const char* hex =
      "44435250010000005000400000000000cb975b7942fad3c029000000000000002a00000000000000030000"
      "00110000000500000004000000d4010000000000000000000000000000000000000000000001000000020203"
      "04070000000000000064000000000000001200000000000000090000000000000014000000000000000b0000"
      "00000000000000000000000000030000000501020307000000000000002c010000000000000b000000000000"
      "00020000000000000014000000000000000b0000000000000000000000000000000200000003020102020000"
      "00000000003f000000000000000d000000000000000400000000000000110000000000000008000000000000"
      "0000000000000000000500000017010103010000000000000028000000000000000c00000000000000030000"
      "00000000000d000000000000000400000000000000000000000000000028b52ffd20094900000301000a0a03"
      "0001fe28b52ffd200b5900000202010405203b09d8ff0f28b52ffd20021100000d8e28b52ffd200b59000001"
      "010e0d030f0802c0ff0128b52ffd20042100000205100228b52ffd2008410000012000000000000028b52ffd"
      "200319000000060728b52ffd2004210000000d340226212b1c906368da";
  bytes_t golden;
  for (const char* p = hex; *p != 0; p += 2)
    golden.push_back(static_cast<std::byte>(std::stoul(std::string(p, 2), nullptr, 16)));
  REQUIRE(golden.size() == 468);

  const auto make = [](const char* name, encoding enc, std::vector<std::uint64_t> idx,
                       std::vector<std::uint64_t> words) {
    item it;
    it.tensor = registry().id(name);
    it.type = registry().at(it.tensor).type;
    it.enc = enc;
    it.indices = std::move(idx);
    it.values.resize(it.count() * it.word_bytes());
    for (std::size_t i = 0; i < words.size(); ++i)  // little-endian host
      std::memcpy(it.values.data() + i * it.word_bytes(), &words[i], it.word_bytes());
    return it;
  };
  const std::vector<item> want = {
      make("b.f16", encoding::ulp, {0, 1, 2, 3, 50, 98, 99},
           {1, 0xffff, 2, 0xfffd, 0x012c, 0x8000, 5}),
      make("d.f8", encoding::xor_mask, {0, 2, 3, 9, 10, 11, 15},
           {0x01, 0x80, 0x7f, 0x03, 0xff, 0x10, 0x02}),
      make("c.f32", encoding::ulp, {5, 40}, {0xffffffffu, 0x10}),
      make("f.u64", encoding::xor_mask, {39}, {0x1234})};
  dcr::payload_decoder dec;
  std::vector<item> got;
  CHECK(dec.decode(golden, registry(), got).id == make_header().id);
  check_same(got, want);

  // The reference writer still writes exactly these bytes (the documented stream contents).
  const std::vector<ref_entry> ref = {
      ref_from_item(want[0], dcr::location_coding::runs, 1, dcr::value_coding::zigzag_buckets, 2),
      ref_from_item(want[1], dcr::location_coding::bitmap, 0, dcr::value_coding::buckets, 1),
      ref_from_item(want[2], dcr::location_coding::skip_buckets, 2,
                    dcr::value_coding::zigzag_planes, 0),
      ref_from_item(want[3], dcr::location_coding::skip_buckets, 0, dcr::value_coding::buckets, 0)};
  const auto hex_of = [](const bytes_t& b) {
    std::string h;
    char buf[3];
    for (auto x : b) {
      std::snprintf(buf, sizeof buf, "%02x", std::to_integer<unsigned>(x));
      h += buf;
    }
    return h;
  };
  CHECK(hex_of(ref[0].location_raw) == "0301000a0a030001fe");
  CHECK(hex_of(ref[0].value_raw) == "0202010405203b09d8ff0f");
  CHECK(hex_of(ref[1].location_raw) == "0d8e");
  CHECK(hex_of(ref[1].value_raw) == "01010e0d030f0802c0ff01");
  CHECK(hex_of(ref[2].location_raw) == "02051002");
  CHECK(hex_of(ref[2].value_raw) == "0120000000000000");
  CHECK(hex_of(ref[3].location_raw) == "000607");
  CHECK(hex_of(ref[3].value_raw) == "000d3402");
}

TEST_CASE("determinism: equal inputs give equal bytes, whatever the encoder has done before") {
  std::mt19937_64 rng(21);
  const std::vector<item> a = {random_item("a.bf16", encoding::xor_mask, pattern::sparse, rng),
                               random_item("d.f8", encoding::overwrite, pattern::sparse, rng),
                               random_item("c.f32", encoding::ulp, pattern::dense, rng)};
  const std::vector<item> other = {random_item("c.f32", encoding::overwrite, pattern::dense, rng)};
  for (const dcr::codec_options& o :
       {dcr::codec_options{}, dcr::codec_options{.exact_choice = true},
        dcr::codec_options{.adaptive = false}}) {
    dcr::payload_encoder enc(o);
    bytes_t first, second, third;
    enc.encode(make_header(), a, registry(), first);
    enc.encode(make_header(), other, registry(), second);  // warm with something else
    second.assign(second.size() + 100, std::byte{0xee});   // and leave junk in `out`
    enc.encode(make_header(), a, registry(), second);
    dcr::payload_encoder fresh(o);
    fresh.encode(make_header(), a, registry(), third);
    CHECK(first == second);
    CHECK(first == third);
  }
}

TEST_CASE("staging: stage on one encoder, finish on another, get encode's bytes") {
  std::mt19937_64 rng(22);
  const std::vector<item> a = {random_item("a.bf16", encoding::ulp, pattern::sparse, rng),
                               random_item("h.huge", encoding::xor_mask, pattern::first, rng),
                               random_item("d.f8", encoding::overwrite, pattern::dense, rng)};
  const std::vector<item> b = {random_item("b.f16", encoding::xor_mask, pattern::dense, rng)};
  for (const dcr::codec_options& o :
       {dcr::codec_options{}, dcr::codec_options{.exact_choice = true},
        dcr::codec_options{.adaptive = false}}) {
    dcr::payload_encoder one(o), stager(o), finisher(o);
    bytes_t want_a, want_b, got;
    one.encode(make_header(), a, registry(), want_a);
    one.encode(make_header(), b, registry(), want_b);
    dcr::staged_payload sa, sb;
    stager.stage(make_header(), a, registry(), sa);
    stager.stage(make_header(), b, registry(), sb);  // staging b leaves sa alone
    CHECK(sa.item_count() == 3);
    CHECK(sa.max_encoded_size() >= want_a.size());
    finisher.finish(sb, got);
    CHECK(got == want_b);
    finisher.finish(sa, got);
    CHECK(got == want_a);
    finisher.finish(sa, got);  // finish leaves the staged payload unchanged
    CHECK(got == want_a);
  }
  // stage refuses what encode refuses, before touching the staged payload.
  dcr::payload_encoder enc;
  dcr::staged_payload s;
  enc.stage(make_header(), a, registry(), s);
  item bad = a[0];
  bad.values.pop_back();
  const std::vector<item> bads = {bad};
  CHECK(code_of([&] { enc.stage(make_header(), bads, registry(), s); }) == errc::invalid_argument);
  bytes_t got, want;
  dcr::payload_encoder().finish(s, got);
  dcr::payload_encoder().encode(make_header(), a, registry(), want);
  CHECK(got == want);
}

TEST_CASE("workspace: encode and decode allocate nothing once warm") {
  std::mt19937_64 rng(31);
  const std::vector<item> items = {random_item("a.bf16", encoding::xor_mask, pattern::sparse, rng),
                                   random_item("f.u64", encoding::overwrite, pattern::dense, rng),
                                   random_item("e.u8", encoding::xor_mask, pattern::sparse, rng),
                                   random_item("c.f32", encoding::ulp, pattern::dense, rng),
                                   random_item("b.f16", encoding::ulp, pattern::dense, rng)};
  std::vector<dcr::codec_options> configs = {{.adaptive = false},
                                             {.byte_planes = false, .adaptive = false},
                                             {},
                                             {.exact_choice = true}};
  for (auto lc : {dcr::location_coding::skip_varint, dcr::location_coding::skip_buckets,
                  dcr::location_coding::bitmap, dcr::location_coding::runs})
    configs.push_back({.location = lc});
  for (auto vc : {dcr::value_coding::raw, dcr::value_coding::zigzag_planes,
                  dcr::value_coding::buckets, dcr::value_coding::zigzag_buckets})
    configs.push_back({.value = vc});
  for (std::size_t k = 0; k < configs.size(); ++k) {
    CAPTURE(k);
    dcr::payload_encoder enc(configs[k]);
    dcr::payload_decoder dec;
    bytes_t out;
    std::vector<item> got;
    // Warm: the decoder's vector and the caller's trade places, so both need a payload.
    for (int warm = 0; warm < 2; ++warm) {
      enc.encode(make_header(), items, registry(), out);
      dec.decode(out, registry(), got);
    }
    alloc_probe probe;
    enc.encode(make_header(), items, registry(), out);
    dec.decode(out, registry(), got);
    dec.decode(out, registry(), got);
    CHECK(probe.count() == 0);
  }
  // Staging and finishing on separate encoders, once warm.
  dcr::payload_encoder stager, finisher;
  dcr::staged_payload staged;
  bytes_t out;
  stager.stage(make_header(), items, registry(), staged);
  finisher.finish(staged, out);
  alloc_probe probe;
  stager.stage(make_header(), items, registry(), staged);
  finisher.finish(staged, out);
  CHECK(probe.count() == 0);
}

TEST_CASE("workspace: choose_encoding allocates nothing once warm") {
  std::mt19937_64 rng(32);
  std::vector<std::uint16_t> o(5000), n(5000);
  for (std::size_t i = 0; i < o.size(); ++i) {
    o[i] = static_cast<std::uint16_t>(rng());
    n[i] = static_cast<std::uint16_t>(o[i] + rng() % 5);
  }
  for (bool exact : {false, true}) {
    const dcr::codec_options opt{.exact_choice = exact};
    (void)dcr::choose_encoding<std::uint16_t>(dcr::encoding_policy::mixed, true, o, n, opt);
    alloc_probe probe;
    (void)dcr::choose_encoding<std::uint16_t>(dcr::encoding_policy::mixed, true, o, n, opt);
    CHECK(probe.count() == 0);
  }
}

// ======================================================================= encoder contract

TEST_CASE("encoder: contract violations throw before `out` is touched") {
  std::mt19937_64 rng(4);
  const item good = random_item("b.f16", encoding::xor_mask, pattern::sparse, rng);
  dcr::payload_encoder enc;
  const auto check = [&](std::vector<item> items, errc want,
                         dcr::payload_header h = make_header()) {
    bytes_t out = {std::byte{1}, std::byte{2}};
    CHECK(code_of([&] { enc.encode(h, items, registry(), out); }) == want);
    CHECK(out == bytes_t{std::byte{1}, std::byte{2}});
  };
  item x = good;
  x.indices[2] = x.indices[1];  // repeated index
  check({x}, errc::invalid_argument);
  x = good;
  std::swap(x.indices[1], x.indices[2]);  // decreasing
  check({x}, errc::invalid_argument);
  x = good;
  x.values.pop_back();
  check({x}, errc::invalid_argument);
  x = good;
  x.enc = static_cast<encoding>(3);  // no such encoding
  check({x}, errc::invalid_argument);
  x = good;
  x.indices.back() = 100;  // numel of b.f16
  check({x}, errc::out_of_range);
  x = good;
  x.tensor = 1000;
  check({x}, errc::unknown_tensor);
  x = good;
  x.type = dtype::bf16;
  check({x}, errc::dtype_mismatch);
  check({good, good}, errc::invalid_argument);  // one tensor twice
  dcr::payload_header h = make_header();
  h.registry_fingerprint ^= 1;
  check({good}, errc::invalid_argument, h);
  CHECK(code_of([] { dcr::payload_encoder bad({.zstd_level = 1000}); }) == errc::invalid_argument);
}

// ======================================================================= decoder errors

TEST_CASE("errors: flipping any bit of a payload is detected") {
  const bytes_t good = encode(small_items());
  REQUIRE(decode_code(good) == errc::ok);
  std::size_t detected = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes_t b = good;
      b[i] ^= static_cast<std::byte>(1u << bit);
      const errc c = decode_code(b);
      if (c != errc::ok)
        ++detected;
      else
        FAIL_CHECK("flip of bit " << bit << " of byte " << i << " went undetected");
    }
  }
  CHECK(detected == good.size() * 8);
}

TEST_CASE("errors: every truncation is truncated_payload, trailing bytes corrupt_payload") {
  const bytes_t good = encode(small_items());
  for (std::size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    const bytes_t b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK(decode_code(b) == errc::truncated_payload);
    CHECK(code_of([&] { (void)dcr::payload_decoder::peek_header(b); }) == errc::truncated_payload);
  }
  bytes_t longer = good;
  longer.push_back(std::byte{0});
  CHECK(decode_code(longer) == errc::corrupt_payload);
}

TEST_CASE("errors: header fields") {
  const bytes_t good = encode(small_items());
  const auto patched = [&](std::size_t off, std::uint64_t v, std::size_t n) {
    bytes_t b = good;
    put(b, off, v, n);
    reseal(b);
    return b;
  };
  CHECK(decode_code(patched(0, 0x50524345, 4)) == errc::corrupt_payload);  // magic
  CHECK(decode_code(patched(4, 2, 2)) == errc::unsupported_version);
  CHECK(decode_code(patched(4, 0, 2)) == errc::unsupported_version);
  CHECK(decode_code(patched(8, 96, 2)) == errc::corrupt_payload);   // header size
  CHECK(decode_code(patched(10, 72, 2)) == errc::corrupt_payload);  // entry size
  // Reserved: flags, bytes 12-15, 64-79, with the checksum recomputed.
  for (std::size_t bit = 0; bit < 16; ++bit)
    CHECK(decode_code(patched(6, 1ull << bit, 2)) == errc::reserved_bits_set);
  CHECK(decode_code(patched(12, 1ull << 31, 4)) == errc::reserved_bits_set);
  for (std::size_t off = 64; off < 80; ++off)
    CHECK(decode_code(patched(off, 0x01, 1)) == errc::reserved_bits_set);
  // The same bytes damaged in transit (checksum not recomputed) read as corruption, and so does
  // an item count that no longer fits: the checksum comes first.
  for (std::size_t off : {6u, 7u, 12u, 15u, 64u, 79u, 52u, 55u}) {
    bytes_t damaged = good;
    damaged[off] ^= std::byte{0x20};
    CAPTURE(off);
    CHECK(decode_code(damaged) == errc::corrupt_payload);
  }
  // Total size: larger is truncation, smaller leaves trailing bytes.
  CHECK(decode_code(patched(56, good.size() + 1, 8)) == errc::truncated_payload);
  CHECK(decode_code(patched(56, good.size() - 1, 8)) == errc::corrupt_payload);
  // Item count: more entries than the payload can hold.
  CHECK(decode_code(patched(52, 0xffffffffu, 4)) == errc::overflow);
  CHECK(decode_code(patched(52, 3, 4)) != errc::ok);  // a third entry read from stream bytes
  // Checksum.
  bytes_t bad = good;
  bad.back() ^= std::byte{0x80};
  CHECK(decode_code(bad) == errc::corrupt_payload);
  CHECK(message_of([&] {
          dcr::payload_decoder d;
          std::vector<item> v;
          d.decode(bad, registry(), v);
        }).find("checksum") != std::string::npos);
  // peek_header reads the header without the checksum.
  CHECK(dcr::payload_decoder::peek_header(bad).id == make_header().id);
}

TEST_CASE("errors: stale transitions and foreign registries") {
  const bytes_t good = encode(small_items());
  const dcr::attempt_key ok{41, 42, 3};
  CHECK(decode_code(good, &ok) == errc::ok);
  for (const dcr::attempt_key f :
       {dcr::attempt_key{40, 42, 3}, dcr::attempt_key{41, 43, 3},
        dcr::attempt_key{41, 42, 4}})
    CHECK(decode_code(good, &f) == errc::stale_payload);
  bytes_t foreign = good;
  put(foreign, 16, registry().fingerprint() + 1, 8);
  reseal(foreign);
  CHECK(decode_code(foreign) == errc::registry_mismatch);
}

TEST_CASE("errors: item entries checked against the registry and the format") {
  std::mt19937_64 rng(6);
  const item it = random_item("b.f16", encoding::xor_mask, pattern::sparse, rng);
  const auto build = [&](auto&& mutate) {
    std::vector<ref_entry> e = {ref_from_item(it, true)};
    mutate(e[0]);
    return ref_build(make_header(), e);
  };
  CHECK(decode_code(build([](ref_entry&) {})) == errc::ok);
  CHECK(decode_code(build([](ref_entry& e) { e.tensor = 8; })) == errc::unknown_tensor);
  CHECK(decode_code(build([](ref_entry& e) { e.tensor = 0xffffffffu; })) == errc::unknown_tensor);
  CHECK(decode_code(build([](ref_entry& e) { e.dtype_code = 1; })) == errc::dtype_mismatch);
  CHECK(decode_code(build([](ref_entry& e) { e.dtype_code = 200; })) == errc::dtype_mismatch);
  CHECK(decode_code(build([](ref_entry& e) { e.encoding_code = 3; })) == errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.encoding_code = 9; })) == errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.location_code = 4; })) == errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.location_code = 0xff; })) ==
        errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.value_code = 5; })) == errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.value_code = 0x80; })) == errc::unsupported_version);
  CHECK(decode_code(build([](ref_entry& e) { e.numel = 101; })) == errc::shape_mismatch);
  CHECK(decode_code(build([](ref_entry& e) { e.count = 101; })) == errc::overflow);
  // count disagrees with the value stream's size
  CHECK(decode_code(build([](ref_entry& e) { e.count -= 1; })) == errc::corrupt_payload);
  // value stream one word short / one byte long
  CHECK(decode_code(build([](ref_entry& e) { e.value_raw.resize(e.value_raw.size() - 2); })) ==
        errc::corrupt_payload);
  CHECK(decode_code(build([](ref_entry& e) { e.value_raw.push_back(std::byte{0}); })) ==
        errc::corrupt_payload);

  // Entry reserved field, with the checksum recomputed.
  bytes_t b = build([](ref_entry&) {});
  put(b, 80 + 56, 1ull << 63, 8);
  reseal(b);
  CHECK(decode_code(b) == errc::reserved_bits_set);

  // The same tensor twice in one payload.
  std::vector<ref_entry> two = {ref_from_item(it, true), ref_from_item(it, false)};
  CHECK(decode_code(ref_build(make_header(), two)) == errc::corrupt_payload);
  CHECK(message_of([&] {
          dcr::payload_decoder d;
          std::vector<item> v;
          d.decode(ref_build(make_header(), two), registry(), v);
        }).find("both name tensor 'b.f16'") != std::string::npos);
}

TEST_CASE("errors: stream sizes and frames") {
  std::mt19937_64 rng(10);
  const std::vector<item> items = small_items();
  const bytes_t good = encode(items);
  const auto patched = [&](std::size_t off, std::uint64_t v) {
    bytes_t b = good;
    put(b, off, v, 8);
    reseal(b);
    return b;
  };
  const std::size_t e0 = 80, e1 = 80 + 64;
  const std::uint64_t loc0 = get(good, e0 + 24, 8);
  // Compressed sizes that overrun the stream area, overflow when summed, or leave a gap.
  CHECK(decode_code(patched(e0 + 24, good.size())) == errc::corrupt_payload);
  CHECK(decode_code(patched(e0 + 24, ~0ull)) == errc::corrupt_payload);
  CHECK(decode_code(patched(e1 + 40, ~0ull - 5)) == errc::corrupt_payload);
  CHECK(decode_code(patched(e1 + 40, get(good, e1 + 40, 8) - 1)) == errc::corrupt_payload);
  // Sizes that still tile the area but cut a frame short.
  {
    bytes_t b = good;
    put(b, e0 + 24, loc0 - 1, 8);
    put(b, e0 + 40, get(good, e0 + 40, 8) + 1, 8);
    reseal(b);
    CHECK(decode_code(b) == errc::corrupt_payload);
  }
  // Raw sizes differing from the frames' content sizes.
  CHECK(decode_code(patched(e0 + 32, get(good, e0 + 32, 8) + 1)) == errc::corrupt_payload);
  CHECK(decode_code(patched(e0 + 48, get(good, e0 + 48, 8) + 2)) == errc::corrupt_payload);
  // A location stream claiming 10^12 raw bytes is refused without allocating for it.
  {
    const bytes_t b = patched(e0 + 32, 1'000'000'000'000ull);
    dcr::payload_decoder dec;
    std::vector<item> got;
    alloc_probe probe;
    CHECK(code_of([&] { dec.decode(b, registry(), got); }) == errc::corrupt_payload);
    CHECK(probe.largest() < (1u << 16));
  }
  // A frame followed by a second frame, or replaced by a skippable frame.
  {
    std::vector<ref_entry> e = {ref_from_item(items[0], true)};
    bytes_t frames = zstd1(e[0].location_raw);
    const bytes_t extra = zstd1({});
    frames.insert(frames.end(), extra.begin(), extra.end());
    e[0].location_frame = frames;
    CHECK(decode_code(ref_build(make_header(), e)) == errc::corrupt_payload);
    bytes_t skippable(8 + e[0].location_raw.size());
    put(skippable, 0, ZSTD_MAGIC_SKIPPABLE_START, 4);
    put(skippable, 4, e[0].location_raw.size(), 4);
    e[0].location_frame = skippable;
    CHECK(decode_code(ref_build(make_header(), e)) == errc::corrupt_payload);
  }
}

TEST_CASE("errors: locations") {
  const auto f16 = registry().id("b.f16");  // numel 100
  const auto with_skips = [&](std::initializer_list<std::uint64_t> skips, bytes_t extra = {}) {
    ref_entry e;
    e.tensor = f16;
    e.dtype_code = static_cast<std::uint8_t>(dtype::f16);
    e.encoding_code = 0;
    e.value_code = 1;
    e.numel = 100;
    for (auto s : skips) leb128(e.location_raw, s);
    e.location_raw.insert(e.location_raw.end(), extra.begin(), extra.end());
    e.count = skips.size();
    e.value_raw.assign(2 * e.count, std::byte{0x3c});
    return ref_build(make_header(), {e});
  };
  dcr::payload_decoder dec;
  std::vector<item> got;
  dec.decode(with_skips({0, 98}), registry(), got);  // indices 0 and 99 (= numel - 1)
  REQUIRE(got.size() == 1);
  CHECK(got[0].indices == std::vector<std::uint64_t>{0, 99});
  dec.decode(with_skips({5, 0, 0, 3}), registry(), got);
  CHECK(got[0].indices == std::vector<std::uint64_t>{5, 6, 7, 11});

  CHECK(decode_code(with_skips({100})) == errc::out_of_range);                   // index 100
  CHECK(decode_code(with_skips({0, 99})) == errc::out_of_range);                 // 0 then 100
  CHECK(decode_code(with_skips({50, 49})) == errc::out_of_range);                // 50 then 100
  CHECK(decode_code(with_skips({5}, {std::byte{0}})) == errc::corrupt_payload);  // trailing byte
  CHECK(message_of([&] {
          dec.decode(with_skips({50, 49}), registry(), got);
        }).find("record 1 index 100 >= numel 100") != std::string::npos);
  // A non-minimal varint (0 written as 0x80 0x00), within the size two records may take.
  {
    ref_entry e;
    e.tensor = f16;
    e.dtype_code = static_cast<std::uint8_t>(dtype::f16);
    e.value_code = 1;
    e.numel = 100;
    e.count = 2;
    e.location_raw = {std::byte{0x80}, std::byte{0x00}};
    e.value_raw.assign(4, std::byte{0});
    CHECK(decode_code(ref_build(make_header(), {e})) == errc::corrupt_payload);
  }
}

TEST_CASE("errors: the newer codings are validated before anything is returned") {
  std::mt19937_64 rng(40);
  const item it = random_item("b.f16", encoding::ulp, pattern::sparse, rng);  // numel 100
  const auto build = [&](dcr::location_coding lc, dcr::value_coding vc, auto&& mutate) {
    std::vector<ref_entry> e = {ref_from_item(it, lc, 2, vc, 3)};
    mutate(e[0]);
    return ref_build(make_header(), e);
  };
  using L = dcr::location_coding;
  using V = dcr::value_coding;
  const auto none = [](ref_entry&) {};
  // Each coding decodes as written.
  for (auto lc : {L::skip_varint, L::skip_buckets, L::bitmap, L::runs})
    for (auto vc : {V::raw, V::byte_planes, V::zigzag_planes, V::buckets, V::zigzag_buckets})
      CHECK(decode_code(build(lc, vc, none)) == errc::ok);

  // Raw sizes a coding cannot have, refused from the entry before decompressing.
  CHECK(decode_code(build(L::skip_buckets, V::byte_planes, [](ref_entry& e) {
          e.location_raw.resize(e.count);  // no room for the header
        })) == errc::corrupt_payload);
  CHECK(decode_code(build(L::bitmap, V::byte_planes, [](ref_entry& e) {
          e.location_raw.resize(14, std::byte{0});  // more than ceil(100 / 8) bytes
        })) == errc::corrupt_payload);
  CHECK(decode_code(build(L::skip_buckets, V::buckets, [](ref_entry& e) {
          e.value_raw.resize(e.count);  // no room for the header
        })) == errc::corrupt_payload);
  CHECK(decode_code(build(L::skip_buckets, V::zigzag_planes, [](ref_entry& e) {
          e.value_raw.push_back(std::byte{0});  // planes are exactly count * 2 bytes
        })) == errc::corrupt_payload);

  // Field by field, after decompressing.
  CHECK(decode_code(build(L::skip_buckets, V::byte_planes, [](ref_entry& e) {
          e.location_raw[0] = std::byte{0x12};  // reserved bucket header bits
        })) == errc::reserved_bits_set);
  CHECK(decode_code(build(L::skip_buckets, V::byte_planes, [](ref_entry& e) {
          e.location_raw.push_back(std::byte{0});  // an extra-bit byte no symbol needs
        })) == errc::corrupt_payload);
  CHECK(decode_code(build(L::bitmap, V::byte_planes, [](ref_entry& e) {
          e.location_raw[0] ^= std::byte{0x02};  // one record more or less than the count
        })) == errc::corrupt_payload);
  CHECK(decode_code(build(L::bitmap, V::byte_planes, [&](ref_entry& e) {
          // Move the last record to element 100 (>= numel 100), in the 13th and last byte.
          const std::uint64_t last = it.indices.back();
          e.location_raw[last / 8] &= ~static_cast<std::byte>(1u << (last % 8));
          e.location_raw.resize(13, std::byte{0});
          e.location_raw[12] = std::byte{0x10};
        })) == errc::out_of_range);
  CHECK(decode_code(build(L::runs, V::byte_planes, [](ref_entry& e) {
          e.location_raw[0] = static_cast<std::byte>(std::to_integer<unsigned>(e.location_raw[0]) + 1);
        })) == errc::corrupt_payload);  // a run count the symbols do not match
  CHECK(decode_code(build(L::skip_buckets, V::zigzag_buckets, [](ref_entry& e) {
          e.value_raw[0] = std::byte{0x08};  // reserved bucket header bit
        })) == errc::reserved_bits_set);
  CHECK(decode_code(build(L::skip_buckets, V::buckets, [](ref_entry& e) {
          e.value_raw[1] = std::byte{0xff};  // a symbol of a bit length beyond 16
        })) == errc::corrupt_payload);

  // A failed decode returns nothing: the caller's items are as they were.
  dcr::payload_decoder dec;
  std::vector<item> got;
  dec.decode(encode(small_items()), registry(), got);
  const std::vector<item> before = got;
  const bytes_t bad = build(L::bitmap, V::byte_planes, [](ref_entry& e) {
    e.location_raw[0] ^= std::byte{0x02};
  });
  const std::string m = message_of([&] { dec.decode(bad, registry(), got); });
  CHECK(m.find("item 0") != std::string::npos);
  CHECK(m.find("'b.f16'") != std::string::npos);
  CHECK(m.find("location stream at byte 144") != std::string::npos);
  CHECK(m.find("bits set for") != std::string::npos);
  check_same(got, before);
}

TEST_CASE("errors: a hostile bitmap claiming a huge tensor allocates nothing large") {
  // h.huge has 10^9 elements, so a bitmap may be 125 MB raw: legal, but not from a frame of a
  // few bytes whose header claims it.
  ref_entry e;
  e.tensor = registry().id("h.huge");
  e.dtype_code = static_cast<std::uint8_t>(dtype::bf16);
  e.location_code = static_cast<std::uint8_t>(dcr::location_coding::bitmap);
  e.numel = 1'000'000'000;
  e.count = 1;
  bytes_t f(4 + 1 + 8 + 3 + 1);  // single-segment frame header, content size 125e6, RLE block
  put(f, 0, ZSTD_MAGICNUMBER, 4);
  put(f, 4, 0xe0, 1);
  put(f, 5, 125'000'000, 8);
  put(f, 13, (1u << 3) | (1u << 1) | 1u, 3);
  e.location_frame = f;
  e.value_raw.assign(2, std::byte{0});
  const bytes_t b = ref_build(make_header(), {e});
  dcr::payload_decoder dec;
  std::vector<item> got;
  alloc_probe probe;
  CHECK(code_of([&] { dec.decode(b, registry(), got); }) == errc::corrupt_payload);
  CHECK(probe.largest() < (1u << 16));
}

TEST_CASE("errors: hostile counts on a large tensor allocate nothing large") {
  // h.huge has 10^9 elements: a dense item is legal, so only the frames can expose the lie.
  const auto huge = registry().id("h.huge");
  ref_entry e;
  e.tensor = huge;
  e.dtype_code = static_cast<std::uint8_t>(dtype::bf16);
  e.numel = 1'000'000'000;
  e.count = 1'000'000'000;
  // A location frame whose header claims 10^9 bytes of content but holds one RLE block.
  bytes_t f(4 + 1 + 8 + 3 + 1);
  put(f, 0, ZSTD_MAGICNUMBER, 4);
  put(f, 4, 0xe0, 1);
  put(f, 5, e.count, 8);
  put(f, 13, (1u << 3) | (1u << 1) | 1u, 3);
  e.location_frame = f;
  e.value_raw.assign(16, std::byte{0});
  bytes_t b = ref_build(make_header(), {e});
  put(b, 80 + 48, 2 * e.count, 8);  // value raw size consistent with the count
  reseal(b);
  dcr::payload_decoder dec;
  std::vector<item> got;
  alloc_probe probe;
  CHECK(code_of([&] { dec.decode(b, registry(), got); }) == errc::corrupt_payload);
  CHECK(probe.largest() < (1u << 16));
}

TEST_CASE("errors: messages name the item, the tensor and the byte offset") {
  std::mt19937_64 rng(12);
  std::vector<ref_entry> e = {
      ref_from_item(random_item("a.bf16", encoding::xor_mask, pattern::sparse, rng), true),
      ref_from_item(random_item("c.f32", encoding::xor_mask, pattern::sparse, rng), true)};
  e[1].dtype_code = static_cast<std::uint8_t>(dtype::bf16);
  const std::string m = message_of([&] {
    dcr::payload_decoder d;
    std::vector<item> v;
    d.decode(ref_build(make_header(), e), registry(), v);
  });
  CHECK(m.find("item 1") != std::string::npos);
  CHECK(m.find("'c.f32'") != std::string::npos);
  CHECK(m.find("byte 144") != std::string::npos);
}

