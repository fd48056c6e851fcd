// Choosing encodings and codings (codec/choose.hpp): policies are obeyed, mixed picks an
// encoding that is truly smaller where one clearly wins, each stream gets the coding that suits
// its data, and the payloads reach the sizes the format was designed for.
#include <doctest/doctest.h>

#include <zstd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "dcr/codec/choose.hpp"
#include "dcr/codec/payload.hpp"

namespace {

using dcr::codec_options;
using dcr::dtype;
using dcr::encoding;
using dcr::encoding_policy;
using dcr::location_coding;
using dcr::value_coding;
using bytes_t = std::vector<std::byte>;

std::uint16_t to_bf16(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);  // nearest even
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t b = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The paper's stress update: a fraction `rate` of N(0, 1) BF16 weights scaled by (1 + 0.01 z).
struct update {
  std::vector<std::uint64_t> indices;
  std::vector<std::uint16_t> old_bits, new_bits;
};
update stress(std::size_t n, double rate, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<double> uniform(0, 1);
  update u;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t x = to_bf16(normal(rng));
    if (uniform(rng) >= rate) continue;
    const std::uint16_t y = to_bf16(from_bf16(x) * (1 + 0.01f * normal(rng)));
    if (y == x) continue;
    u.indices.push_back(i);
    u.old_bits.push_back(x);
    u.new_bits.push_back(y);
  }
  return u;
}

dcr::tensor_registry one_tensor(std::int64_t numel, dtype t = dtype::bf16) {
  return dcr::tensor_registry({{"w", t, {numel}}});
}

bytes_t encode_item(const dcr::item& it, const dcr::tensor_registry& reg, codec_options o = {}) {
  dcr::payload_header h;
  h.registry_fingerprint = reg.fingerprint();
  dcr::payload_encoder enc(o);
  bytes_t out;
  const std::vector<dcr::item> items = {it};
  enc.encode(h, items, reg, out);
  return out;
}

dcr::item_entry entry_of(const bytes_t& payload) {
  std::vector<dcr::item_entry> table;
  dcr::payload_decoder::read_table(payload, table);
  REQUIRE(table.size() == 1);
  return table[0];
}

}  // namespace

// ======================================================================= choose_encoding

TEST_CASE("choose_encoding: policies and permission decide before any estimate") {
  const update u = stress(20000, 0.05, 1);
  const std::span<const std::uint16_t> o = u.old_bits, n = u.new_bits;
  CHECK(dcr::choose_encoding<std::uint16_t>(encoding_policy::overwrite_only, true, o, n) ==
        encoding::overwrite);
  for (auto p : {encoding_policy::mixed, encoding_policy::xor_only, encoding_policy::ulp_only})
    CHECK(dcr::choose_encoding<std::uint16_t>(p, false, o, n) == encoding::overwrite);
  CHECK(dcr::choose_encoding<std::uint16_t>(encoding_policy::xor_only, true, o, n) ==
        encoding::xor_mask);
  CHECK(dcr::choose_encoding<std::uint16_t>(encoding_policy::ulp_only, true, o, n) ==
        encoding::ulp);
  // No records: nothing to gain from a delta, overwrite is idempotent.
  CHECK(dcr::choose_encoding<std::uint16_t>(encoding_policy::mixed, true, {}, {}) ==
        encoding::overwrite);
  const std::vector<std::uint16_t> shorter(o.begin(), o.end() - 1);
  CHECK_THROWS_AS(
      (void)dcr::choose_encoding<std::uint16_t>(encoding_policy::mixed, true, shorter, n),
      dcr::error);
}

namespace {
// Encodes the item in every encoding and checks that `chosen` gives the smallest payload
// (within 1%: estimates).
template <class W>
void check_truly_smallest(encoding chosen, const std::vector<std::uint64_t>& idx,
                          const std::vector<W>& o, const std::vector<W>& n, dtype t,
                          std::int64_t numel) {
  const auto reg = one_tensor(numel, t);
  std::map<encoding, std::size_t> size;
  for (auto e : {encoding::overwrite, encoding::xor_mask, encoding::ulp})
    size[e] = encode_item(dcr::make_item<W>(0, t, e, idx, o, n), reg).size();
  for (auto [e, s] : size) {
    CAPTURE(static_cast<int>(e));
    CHECK(static_cast<double>(size[chosen]) <= 1.01 * static_cast<double>(s));
  }
}
}  // namespace

TEST_CASE("choose_encoding: mixed picks the encoding that is truly smaller") {
  for (const bool exact : {false, true}) {
    CAPTURE(exact);
    const codec_options opt{.exact_choice = exact};
    SUBCASE("small float updates: ulp") {
      const update u = stress(400000, 0.05, 2);
      const encoding e = dcr::choose_encoding<std::uint16_t>(encoding_policy::mixed, true,
                                                             u.old_bits, u.new_bits, opt);
      CHECK(e == encoding::ulp);
      check_truly_smallest<std::uint16_t>(e, u.indices, u.old_bits, u.new_bits, dtype::bf16,
                                          400000);
    }
    SUBCASE("new weights unrelated to the old ones: overwrite") {
      std::mt19937_64 rng(3);
      std::normal_distribution<float> normal(0, 1);
      std::vector<std::uint64_t> idx;
      std::vector<std::uint16_t> o, n;
      for (std::uint64_t i = 0; i < 20000; ++i) {
        idx.push_back(i);
        o.push_back(static_cast<std::uint16_t>(rng()));  // garbage (e.g. uninitialised)
        n.push_back(to_bf16(normal(rng) * 0.02f));       // a fresh initialisation
      }
      const encoding e =
          dcr::choose_encoding<std::uint16_t>(encoding_policy::mixed, true, o, n, opt);
      CHECK(e == encoding::overwrite);
      check_truly_smallest<std::uint16_t>(e, idx, o, n, dtype::bf16, 20000);
    }
    SUBCASE("sign flips: xor") {
      // Negating a weight is one xor bit, but a long way in ulps.
      std::mt19937_64 rng(4);
      std::normal_distribution<float> normal(0, 1);
      std::vector<std::uint64_t> idx;
      std::vector<std::uint32_t> o, n;
      for (std::uint64_t i = 0; i < 20000; ++i) {
        float f = normal(rng);
        std::uint32_t b;
        std::memcpy(&b, &f, 4);
        idx.push_back(i);
        o.push_back(b);
        n.push_back(b ^ 0x80000000u);
      }
      const encoding e =
          dcr::choose_encoding<std::uint32_t>(encoding_policy::mixed, true, o, n, opt);
      CHECK(e == encoding::xor_mask);
      check_truly_smallest<std::uint32_t>(e, idx, o, n, dtype::f32, 20000);
    }
  }
}

// ======================================================================= codings

TEST_CASE("codings: each stream gets the coding that suits its data") {
  const auto reg = one_tensor(1 << 16);
  std::mt19937_64 rng(5);
  const auto item_with = [&](std::vector<std::uint64_t> idx) {
    std::vector<std::uint16_t> o(idx.size()), n(idx.size());
    for (std::size_t i = 0; i < idx.size(); ++i) {
      o[i] = to_bf16(std::normal_distribution<float>(0, 1)(rng));
      n[i] = static_cast<std::uint16_t>(o[i] + 1 + rng() % 3);
    }
    return dcr::make_item<std::uint16_t>(0, dtype::bf16, encoding::ulp, idx, o, n);
  };
  SUBCASE("a fully changed tensor is one run") {
    std::vector<std::uint64_t> idx(1 << 16);
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    const bytes_t p = encode_item(item_with(idx), reg);
    const auto e = entry_of(p);
    CHECK(e.location_code == static_cast<std::uint8_t>(location_coding::runs));
    CHECK(e.location_size < 32);
  }
  SUBCASE("a third of the elements: bitmap") {
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < (1 << 16); ++i)
      if (rng() % 3 == 0) idx.push_back(i);
    const auto e = entry_of(encode_item(item_with(idx), reg));
    CHECK(e.location_code == static_cast<std::uint8_t>(location_coding::bitmap));
    // About the binary entropy of 1/3 per element (0.918 bits), within 10%.
    CHECK(static_cast<double>(e.location_size) < 1.1 * 0.918 * (1 << 16) / 8);
  }
  SUBCASE("a few percent: skip buckets, small ulp deltas as planes or buckets") {
    const auto big = one_tensor(1 << 20);
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < (1 << 20); ++i)
      if (rng() % 50 == 0) idx.push_back(i);
    const auto e = entry_of(encode_item(item_with(idx), big));
    CHECK(e.location_code == static_cast<std::uint8_t>(location_coding::skip_buckets));
    CHECK((e.value_code == static_cast<std::uint8_t>(value_coding::zigzag_planes) ||
           e.value_code == static_cast<std::uint8_t>(value_coding::zigzag_buckets)));
  }
  SUBCASE("tensors of long changed blocks: runs") {
    std::vector<std::uint64_t> idx;
    for (std::uint64_t i = 0; i < (1 << 16); ++i)
      if ((i / 256) % 5 == 1) idx.push_back(i);
    const auto e = entry_of(encode_item(item_with(idx), reg));
    CHECK(e.location_code == static_cast<std::uint8_t>(location_coding::runs));
  }
}

TEST_CASE("codings: the choice is never far from the smallest candidate") {
  // Exact choice compresses every candidate; the estimate may pick another, but not a much
  // larger one.
  std::mt19937_64 rng(6);
  for (double rate : {0.002, 0.03, 0.2, 0.6}) {
    CAPTURE(rate);
    const update u = stress(300000, rate, static_cast<std::uint64_t>(rate * 1000));
    const auto reg = one_tensor(300000);
    for (auto e : {encoding::ulp, encoding::xor_mask, encoding::overwrite}) {
      const auto it = dcr::make_item<std::uint16_t>(0, dtype::bf16, e, u.indices, u.old_bits,
                                                    u.new_bits);
      const std::size_t estimated = encode_item(it, reg).size();
      const std::size_t exact = encode_item(it, reg, {.exact_choice = true}).size();
      CAPTURE(static_cast<int>(e));
      CHECK(exact <= estimated);
      CHECK(static_cast<double>(estimated) <= 1.05 * static_cast<double>(exact));
    }
  }
}

TEST_CASE("codings: forced codings are used where they suit the item") {
  const auto reg = one_tensor(1000);
  std::vector<std::uint64_t> sparse = {3, 400, 999}, dense;
  for (std::uint64_t i = 0; i < 1000; ++i)
    if ((i / 4) % 2 == 0) dense.push_back(i);  // runs of four: suits bitmap and runs
  const std::vector<std::uint16_t> z3(3), n3 = {1, 2, 3};
  const std::vector<std::uint16_t> zd(dense.size()), nd(dense.size(), 0x3f80);
  const auto sp = dcr::make_item<std::uint16_t>(0, dtype::bf16, encoding::xor_mask, sparse, z3, n3);
  const auto de = dcr::make_item<std::uint16_t>(0, dtype::bf16, encoding::xor_mask, dense, zd, nd);
  for (auto c : {location_coding::skip_varint, location_coding::skip_buckets,
                 location_coding::bitmap, location_coding::runs}) {
    const auto e = entry_of(encode_item(de, reg, {.location = c}));
    CHECK(e.location_code == static_cast<std::uint8_t>(c));
  }
  // Bitmap and runs do not suit three scattered records: the usual choice instead.
  CHECK(entry_of(encode_item(sp, reg, {.location = location_coding::bitmap})).location_code !=
        static_cast<std::uint8_t>(location_coding::bitmap));
  CHECK(entry_of(encode_item(sp, reg, {.location = location_coding::runs})).location_code !=
        static_cast<std::uint8_t>(location_coding::runs));
  for (auto c : {value_coding::raw, value_coding::byte_planes, value_coding::zigzag_planes,
                 value_coding::buckets, value_coding::zigzag_buckets}) {
    CHECK(entry_of(encode_item(sp, reg, {.value = c})).value_code == static_cast<std::uint8_t>(c));
  }
  // Version-1 codings only.
  const auto e = entry_of(encode_item(de, reg, {.adaptive = false}));
  CHECK(e.location_code == 0);
  CHECK(e.value_code == 1);
  CHECK(entry_of(encode_item(de, reg, {.byte_planes = false, .adaptive = false})).value_code == 0);
}

// ======================================================================= sizes

namespace {
double binary_entropy(double p) {
  return p <= 0 || p >= 1 ? 0 : -p * std::log2(p) - (1 - p) * std::log2(1 - p);
}
// The paper's coding: xor masks and u16 gaps (escape 0xffff + u32), each compressed by zstd -1.
std::size_t paper_size(const update& u) {
  bytes_t gaps, masks;
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < u.indices.size(); ++i) {
    const std::uint64_t gap = u.indices[i] - prev;
    prev = u.indices[i];
    const auto put16 = [&](std::uint64_t v) {
      gaps.push_back(static_cast<std::byte>(v));
      gaps.push_back(static_cast<std::byte>(v >> 8));
    };
    if (gap >= 0xffff) {
      put16(0xffff);
      put16(gap);
      put16(gap >> 16);
    } else {
      put16(gap);
    }
    const std::uint16_t m = u.old_bits[i] ^ u.new_bits[i];
    masks.push_back(static_cast<std::byte>(m));
    masks.push_back(static_cast<std::byte>(m >> 8));
  }
  const auto z = [](const bytes_t& b) {
    bytes_t out(ZSTD_compressBound(b.size()));
    return ZSTD_compress(out.data(), out.size(), b.data(), b.size(), 1);
  };
  return z(gaps) + z(masks);
}
}  // namespace

TEST_CASE("sizes: stress updates come within 5% of the entropy and well under the paper's") {
  const std::size_t n = 4'000'000;
  const auto reg = one_tensor(static_cast<std::int64_t>(n));
  for (double rate : {0.03, 0.05}) {
    CAPTURE(rate);
    const update u = stress(n, rate, 7);
    const std::size_t changed = u.indices.size();
    const encoding e = dcr::choose_encoding<std::uint16_t>(encoding_policy::mixed, true,
                                                           u.old_bits, u.new_bits);
    REQUIRE(e == encoding::ulp);
    const auto it = dcr::make_item<std::uint16_t>(0, dtype::bf16, e, u.indices, u.old_bits,
                                                  u.new_bits);
    const double ours = static_cast<double>(encode_item(it, reg).size());
    std::map<std::uint16_t, std::uint64_t> hist;
    for (std::size_t i = 0; i < changed; ++i)
      ++hist[dcr::ulp_encoding::encode<std::uint16_t>(u.old_bits[i], u.new_bits[i])];
    double value_bits = 0;
    for (auto [v, c] : hist)
      value_bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / changed);
    const double bound =
        (static_cast<double>(n) * binary_entropy(static_cast<double>(changed) / n) + value_bits) / 8;
    CHECK(ours <= 1.05 * bound);
    CHECK(static_cast<double>(paper_size(u)) >= 1.4 * ours);
  }
}
