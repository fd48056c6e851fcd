// tests/codec/make_golden.cpp: writes the golden corpora of the payload format, once.
//
//   make_golden --out DIR [--force]
//
// writes DIR/golden/NAME.dcrp and DIR/golden/NAME.json (valid payloads and the inputs they were
// encoded from) and DIR/golden-errors/NAME.dcrp and NAME.json (payloads each broken in one way,
// and the error a decoder must report). Run from the repository root with `--out tests`. The
// output is a function of this file, the encoder and the zstd library: the files are produced
// once and committed, and tests/codec/test_golden.cpp checks them on every run, so a change to
// the encoder or the decoder that changes the format shows up as a failing test, not as payloads
// in flight that no longer decode. Existing files are never overwritten without --force.
//
// Every case is checked here before anything is written: each golden payload decodes to its
// items, uses the codings it was made to show, and each error payload fails with its error.
// tests/golden/README.md and tests/golden-errors/README.md describe the cases and the sidecars.
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "golden_corpus.hpp"

namespace {

using namespace dcr_golden;
using dcr::dtype;
using dcr::encoding;
using dcr::errc;
using dcr::item;
using dcr::location_coding;
using dcr::value_coding;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("make_golden: " + what);
}

// ======================================================================= models and headers

/// The model of most cases: every word width, integer and float dtypes, a tensor with no
/// elements, a tensor of 100 elements (not a multiple of 8, for the bitmap index error) and two
/// tensors of one dtype and numel (for the duplicated-tensor error).
dcr::tensor_registry golden_registry() {
  return dcr::tensor_registry({
      {"big.bf16", dtype::bf16, {64, 64}},
      {"empty.bf16", dtype::bf16, {0}},
      {"w1.bool", dtype::boolean, {20}},
      {"w1.f8_e4m3", dtype::f8_e4m3, {48}},
      {"w1.f8_e5m2", dtype::f8_e5m2, {6, 8}},
      {"w1.u8", dtype::u8, {4, 25}},
      {"w2.bf16", dtype::bf16, {16, 8}},
      {"w2.bf16_t", dtype::bf16, {8, 16}},
      {"w2.f16", dtype::f16, {96}},
      {"w2.i16", dtype::i16, {3, 30}},
      {"w4.f32", dtype::f32, {32}},
      {"w4.i32", dtype::i32, {40}},
      {"w4.u32", dtype::u32, {6, 7}},
      {"w8.f64", dtype::f64, {40}},
      {"w8.i64", dtype::i64, {16}},
      {"w8.u64", dtype::u64, {5, 9}},
  });
}

/// The registry of tests/codec/test_payload.cpp, for its first-release golden payload.
dcr::tensor_registry payload_test_registry() {
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

dcr::payload_header header_for(const dcr::tensor_registry& r) {
  dcr::payload_header h;
  h.id = {.attempt = {.base_version = 41, .target_version = 42, .number = 3}, .owner = 17, .sequence = 5};
  h.registry_fingerprint = r.fingerprint();
  return h;
}

/// The attempt every error case's receiver is at (that of header_for()).
const dcr::attempt_key receiver_attempt{41, 42, 3};

// ======================================================================= items

std::uint64_t width_mask(std::size_t word_bytes) {
  return word_bytes == 8 ? ~0ull : (std::uint64_t{1} << (8 * word_bytes)) - 1;
}

/// An item whose records turn the base storage (golden_corpus.hpp, base_word) into `new_words`
/// at `indices`, in encoding `enc`.
item make_golden_item(const dcr::tensor_registry& r, const std::string& name, encoding enc,
                      std::vector<std::uint64_t> indices, const std::vector<std::uint64_t>& new_words) {
  const dcr::tensor_id id = r.id(name);
  const dtype type = r.at(id).type;
  if (indices.size() != new_words.size()) fail("item " + name + ": indices and words differ");
  return dcr::visit_word(dcr::dtype_size(type), [&]<class W>(W) {
    std::vector<W> old_w, new_w;
    for (std::size_t j = 0; j < indices.size(); ++j) {
      old_w.push_back(static_cast<W>(base_word(id, indices[j], sizeof(W))));
      new_w.push_back(static_cast<W>(new_words[j]));
    }
    return dcr::make_item<W>(id, type, enc, indices, old_w, new_w);
  });
}

/// The new bits of every record of `it`, applied to the base storage.
std::vector<std::uint64_t> new_words_of(const item& it) {
  std::vector<std::uint64_t> out;
  dcr::visit_word(it.word_bytes(), [&]<class W>(W) {
    const auto w = it.words<W>();
    dcr::visit_encoding(it.enc, [&](auto e) {
      using E = decltype(e);
      for (std::size_t j = 0; j < it.count(); ++j)
        out.push_back(E::template apply<W>(static_cast<W>(base_word(it.tensor, it.indices[j], sizeof(W))), w[j]));
    });
  });
  return out;
}

/// Bit patterns with a meaning of their own, per float dtype: -0, +0, infinities, quiet and
/// signalling NaNs with payloads, subnormals, the largest finite value.
std::vector<std::uint64_t> special_words(dtype t) {
  switch (t) {
    case dtype::bf16:
      return {0x8000, 0x0000, 0x7f80, 0xff80, 0x7fc0, 0x7fc1, 0xffc1, 0x7f81, 0x0001, 0x807f, 0x007f, 0x7f7f};
    case dtype::f16:
      return {0x8000, 0x0000, 0x7c00, 0xfc00, 0x7e00, 0x7e01, 0xfe01, 0x7c01, 0x0001, 0x83ff, 0x03ff, 0x7bff};
    case dtype::f32:
      return {0x80000000, 0x00000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7fc00001,
              0xffc00001, 0x7f800001, 0x00000001, 0x807fffff, 0x007fffff, 0x7f7fffff};
    case dtype::f64:
      return {0x8000000000000000, 0x0000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
              0x7ff8000000000000, 0x7ff8000000000001, 0xfff8000000000001, 0x7ff0000000000001,
              0x0000000000000001, 0x800fffffffffffff, 0x000fffffffffffff, 0x7fefffffffffffff};
    case dtype::f8_e4m3:  // no infinities; 0x7f and 0xff are NaN
      return {0x80, 0x00, 0x7f, 0xff, 0x01, 0x87, 0x07, 0x7e};
    case dtype::f8_e5m2:
      return {0x80, 0x00, 0x7c, 0xfc, 0x7d, 0x7e, 0x7f, 0xfd, 0x01, 0x83, 0x03, 0x7b};
    default: return {};
  }
}

/// A changed word for `old`: mostly a step of a few representable values (as a training step
/// makes), sometimes a special pattern or random bits. Never equal to `old`.
std::uint64_t changed_word(dtype t, std::uint64_t old, std::mt19937_64& rng) {
  const std::size_t wb = dcr::dtype_size(t);
  const std::uint64_t mask = width_mask(wb);
  std::uint64_t w = 0;
  const unsigned kind = static_cast<unsigned>(rng() % 8);
  const auto specials = special_words(t);
  if (kind == 0 && !specials.empty()) {
    w = specials[rng() % specials.size()];
  } else if (kind == 1) {
    w = rng() & mask;
  } else {
    const std::uint64_t step = 1 + rng() % (kind == 2 ? 300 : 6);
    const bool down = rng() % 2 == 0;
    w = dcr::visit_word(wb, [&]<class W>(W) -> std::uint64_t {
      const W k = dcr::order_key<W>(static_cast<W>(old));
      return dcr::order_unkey<W>(static_cast<W>(down ? k - static_cast<W>(step) : k + static_cast<W>(step)));
    });
  }
  return w == old ? (old ^ 1) & mask : w;
}

/// Changed words for `indices` of tensor `id`.
std::vector<std::uint64_t> changed_words(const dcr::tensor_registry& r, dcr::tensor_id id,
                                         const std::vector<std::uint64_t>& indices,
                                         std::mt19937_64& rng) {
  const dtype t = r.at(id).type;
  std::vector<std::uint64_t> out;
  for (const auto i : indices) out.push_back(changed_word(t, base_word(id, i, dcr::dtype_size(t)), rng));
  return out;
}

/// Clustered indices that suit every location coding: runs of 2 to 4 records separated by gaps
/// of 1 to 5 elements, so that bitmap (one record per 16 elements) and runs (one run per two
/// records) are both eligible.
std::vector<std::uint64_t> clustered_indices(std::uint64_t numel, std::size_t target, std::mt19937_64& rng) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<std::uint64_t> idx;
    std::uint64_t i = rng() % 3;
    while (i < numel && idx.size() < target) {
      const std::uint64_t len = 2 + rng() % 3;
      for (std::uint64_t l = 0; l < len && i < numel && idx.size() < target; ++l) idx.push_back(i++);
      i += 1 + rng() % 5;
    }
    if (dcr::detail::bitmap_eligible(idx) &&
        dcr::detail::runs_eligible(idx.size(), dcr::detail::count_runs(idx)))
      return idx;
  }
  fail("clustered_indices: no pattern suits bitmap and runs");
}

/// `n` distinct indices below `numel`, drawn uniformly, sorted.
std::vector<std::uint64_t> sparse_indices(std::uint64_t numel, std::size_t n, std::mt19937_64& rng) {
  std::vector<bool> take(numel, false);
  std::size_t have = 0;
  while (have < n) {
    const std::uint64_t i = rng() % numel;
    if (!take[i]) {
      take[i] = true;
      ++have;
    }
  }
  std::vector<std::uint64_t> idx;
  for (std::uint64_t i = 0; i < numel; ++i)
    if (take[i]) idx.push_back(i);
  return idx;
}

std::vector<std::uint64_t> all_indices(std::uint64_t numel) {
  std::vector<std::uint64_t> idx(numel);
  for (std::uint64_t i = 0; i < numel; ++i) idx[i] = i;
  return idx;
}

// ======================================================================= golden cases

struct golden_case {
  std::string name;
  std::string description;
  dcr::tensor_registry registry;
  dcr::payload_header header;
  dcr::codec_options options;
  std::vector<item> items;
  bool storage_check = true;
  // What the case was made to show, checked after encoding (entries with records only).
  std::optional<location_coding> expect_location;
  std::optional<value_coding> expect_value;
  std::optional<std::string> expect_hex;  // the exact payload, where it is known from elsewhere
  bytes_t payload;
  std::vector<dcr::item_entry> table;
};

json options_json(const dcr::codec_options& o) {
  json j;
  j["zstd_level"] = o.zstd_level;
  j["zstd_hash_log"] = o.zstd_hash_log;
  j["byte_planes"] = o.byte_planes;
  j["adaptive"] = o.adaptive;
  j["exact_choice"] = o.exact_choice;
  j["location"] = o.location ? json(name_of(location_names, *o.location)) : json(nullptr);
  j["value"] = o.value ? json(name_of(value_names, *o.value)) : json(nullptr);
  return j;
}

std::string hex_of(const bytes_t& b) {
  std::string s;
  for (const auto x : b) s += hex_word(std::to_integer<std::uint64_t>(x), 1).substr(2);
  return s;
}

std::string fingerprint_text(std::uint64_t f) { return hex_word(f, 8); }

json golden_sidecar(const golden_case& c) {
  json j;
  j["description"] = c.description;
  j["format_version"] = dcr::payload_format::version;
  j["zstd_version"] = ZSTD_versionString();
  j["payload_bytes"] = c.payload.size();
  j["registry"] = registry_json(c.registry);
  j["registry_fingerprint"] = fingerprint_text(c.registry.fingerprint());
  j["header"] = header_json(c.header);
  j["options"] = options_json(c.options);
  j["storage_check"] = c.storage_check;
  json items = json::array();
  for (std::size_t i = 0; i < c.items.size(); ++i) {
    const item& it = c.items[i];
    const dcr::item_entry& e = c.table[i];
    json ji;
    ji["tensor"] = c.registry.at(it.tensor).name;
    ji["id"] = it.tensor;
    ji["dtype"] = std::string(dcr::dtype_name(it.type));
    ji["encoding"] = name_of(encoding_names, it.enc);
    ji["location_coding"] = name_of(location_names, static_cast<location_coding>(e.location_code));
    ji["value_coding"] = name_of(value_names, static_cast<value_coding>(e.value_code));
    ji["count"] = it.count();
    ji["indices"] = it.indices;
    json values = json::array();
    for (std::size_t r = 0; r < it.count(); ++r)
      values.push_back(hex_word(load_word(it.values.data(), r, it.word_bytes()), it.word_bytes()));
    ji["values"] = values;
    if (c.storage_check) {
      json news = json::array();
      for (const auto w : new_words_of(it)) news.push_back(hex_word(w, it.word_bytes()));
      ji["new"] = news;
    }
    items.push_back(ji);
  }
  j["items"] = items;
  return j;
}

bool same_items(const std::vector<item>& a, const std::vector<item>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].tensor != b[i].tensor || a[i].type != b[i].type || a[i].enc != b[i].enc ||
        a[i].indices != b[i].indices || a[i].values != b[i].values)
      return false;
  return true;
}

/// Encodes `c`, then checks that the payload decodes to its items and shows what it was made
/// to show.
void encode_case(golden_case& c) {
  dcr::payload_encoder enc(c.options);
  enc.encode(c.header, c.items, c.registry, c.payload);
  dcr::payload_decoder dec;
  std::vector<item> got;
  dec.decode(c.payload, c.registry, got);
  if (!same_items(got, c.items)) fail(c.name + ": payload does not decode to its items");
  dcr::payload_decoder::read_table(c.payload, c.table);
  for (std::size_t i = 0; i < c.table.size(); ++i) {
    const auto& e = c.table[i];
    if (e.count == 0) continue;
    if (c.expect_location && e.location_code != static_cast<std::uint8_t>(*c.expect_location))
      fail(c.name + ": item " + std::to_string(i) + " has location coding " +
           std::to_string(e.location_code) + ", made to show " +
           name_of(location_names, *c.expect_location));
    if (c.expect_value && e.value_code != static_cast<std::uint8_t>(*c.expect_value))
      fail(c.name + ": item " + std::to_string(i) + " has value coding " +
           std::to_string(e.value_code) + ", made to show " + name_of(value_names, *c.expect_value));
  }
  if (c.expect_hex && hex_of(c.payload) != *c.expect_hex)
    fail(c.name + ": payload differs from the known bytes " + *c.expect_hex);
  if (c.payload.size() > 4096) fail(c.name + ": payload of " + std::to_string(c.payload.size()) + " bytes");
}

golden_case base_case(std::string name, std::string description) {
  golden_case c;
  c.name = std::move(name);
  c.description = std::move(description);
  c.registry = golden_registry();
  c.header = header_for(c.registry);
  return c;
}

std::vector<golden_case> golden_cases() {
  std::vector<golden_case> cases;
  const dcr::tensor_registry reg = golden_registry();
  const auto numel = [&](const std::string& n) {
    return static_cast<std::uint64_t>(reg.at(reg.id(n)).numel());
  };

  {
    golden_case c = base_case("empty_payload", "A payload with no items: header and checksum only.");
    cases.push_back(std::move(c));
  }
  {
    // The golden payload of tests/codec/test_payload.cpp and of docs/format.md's example, whose
    // values are xor masks and new bits over zeros: its registry holds a 10^9-element tensor, so
    // no storage is built for it.
    golden_case c;
    c.name = "first_release_example";
    c.registry = payload_test_registry();
    c.description = "The 269-byte first-release payload of docs/format.md's Example and "
                                 "tests/codec/test_payload.cpp (adaptive = false, level 1's own "
                                 "parameters): an f16 xor_mask item and an f32 overwrite item.";
    c.header = header_for(c.registry);
    c.options = {.zstd_level = 1, .zstd_hash_log = 0, .adaptive = false};
    c.storage_check = false;
    const std::vector<std::uint64_t> i0 = {0, 1, 7, 99}, i1 = {62};
    const std::vector<std::uint16_t> z0(4), n0 = {0x8000, 0x0001, 0x7c00, 0x3c00};
    const std::vector<std::uint32_t> z1(1), n1 = {0x7fc00001u};
    c.items = {dcr::make_item<std::uint16_t>(c.registry.id("b.f16"), dtype::f16, encoding::xor_mask, i0, z0, n0),
               dcr::make_item<std::uint32_t>(c.registry.id("c.f32"), dtype::f32, encoding::overwrite, i1, z1, n1)};
    c.expect_location = location_coding::skip_varint;
    c.expect_value = value_coding::byte_planes;
    c.expect_hex =
        "44435250010000005000400000000000cb975b7942fad3c02900000000000000"
        "2a00000000000000030000001100000005000000020000000d01000000000000"
        "0000000000000000000000000000000001000000020100010400000000000000"
        "64000000000000000d0000000000000004000000000000001100000000000000"
        "0800000000000000000000000000000002000000030000010100000000000000"
        "3f000000000000000a0000000000000001000000000000000d00000000000000"
        "0400000000000000000000000000000028b52ffd20042100000000055b28b52f"
        "fd20084100000001000080007c3c28b52ffd20010900003e28b52ffd20042100"
        "000100c07fd8964558648222ec";
    cases.push_back(std::move(c));
  }
  for (const bool planes : {true, false}) {
    golden_case c = base_case(
        planes ? "first_release_planes" : "first_release_raw",
        std::string("First-release codings (adaptive = false, level 1's own parameters): every item "
                    "in skip_varint and ") +
            (planes ? "byte_planes" : "raw") + ", each stream compressed in one call.");
    c.options = {.zstd_level = 1, .zstd_hash_log = 0, .byte_planes = planes, .adaptive = false};
    std::mt19937_64 rng(planes ? 101 : 102);
    const auto add = [&](const std::string& n, encoding enc, std::vector<std::uint64_t> idx) {
      const auto w = changed_words(reg, reg.id(n), idx, rng);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    };
    add("big.bf16", encoding::xor_mask, sparse_indices(numel("big.bf16"), 48, rng));
    add("w4.f32", encoding::overwrite, sparse_indices(numel("w4.f32"), 9, rng));
    add("w8.u64", encoding::ulp, sparse_indices(numel("w8.u64"), 5, rng));
    add("w1.f8_e4m3", encoding::xor_mask, sparse_indices(numel("w1.f8_e4m3"), 12, rng));
    add("empty.bf16", encoding::overwrite, {});
    c.expect_location = location_coding::skip_varint;
    c.expect_value = planes ? value_coding::byte_planes : value_coding::raw;
    cases.push_back(std::move(c));
  }

  // Every location coding x every value coding, each payload with one item per encoding and word
  // width (12 items, in shuffled order).
  {
    const char* tensors[] = {"w1.f8_e4m3", "w1.f8_e5m2", "w1.u8",  "w2.bf16", "w2.f16", "w2.i16",
                             "w4.f32",     "w4.i32",     "w4.u32", "w8.f64",  "w8.i64", "w8.u64"};
    std::size_t combo = 0;
    for (const auto& [lc, lname] : location_names) {
      for (const auto& [vc, vname] : value_names) {
        golden_case c = base_case(
            "coding_" + std::string(lname) + "__" + std::string(vname),
            "Location coding " + std::string(lname) + " and value coding " + std::string(vname) +
                " forced (codec_options.location/.value) for 12 items: each encoding on a tensor of "
                "each word width 1, 2, 4 and 8, in shuffled order.");
        c.options.location = lc;
        c.options.value = vc;
        std::mt19937_64 rng(1000 + combo);
        for (std::size_t k = 0; k < std::size(tensors); ++k) {
          const std::string n = tensors[k];
          auto idx = clustered_indices(numel(n), 5 + rng() % 5, rng);
          const auto w = changed_words(reg, reg.id(n), idx, rng);
          c.items.push_back(make_golden_item(reg, n, static_cast<encoding>((k + combo) % 3), std::move(idx), w));
        }
        std::shuffle(c.items.begin(), c.items.end(), rng);
        c.expect_location = lc;
        c.expect_value = vc;
        cases.push_back(std::move(c));
        ++combo;
      }
    }
  }

  {
    golden_case c = base_case("zero_records",
                              "Items without records: on a tensor with no elements and on tensors "
                              "with elements, in each encoding, beside an item with records.");
    std::mt19937_64 rng(7);
    c.items.push_back(make_golden_item(reg, "empty.bf16", encoding::ulp, {}, {}));
    c.items.push_back(make_golden_item(reg, "w4.f32", encoding::xor_mask, {}, {}));
    std::vector<std::uint64_t> idx = {0, 7, 15};
    c.items.push_back(make_golden_item(reg, "w8.i64", encoding::ulp, idx, changed_words(reg, reg.id("w8.i64"), idx, rng)));
    c.items.push_back(make_golden_item(reg, "w2.f16", encoding::overwrite, {}, {}));
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("dense_bitmap",
                              "Dense items (about half of each tensor changed), for which the "
                              "encoder chooses the bitmap location coding by itself.");
    std::mt19937_64 rng(8);
    auto i0 = sparse_indices(numel("w2.bf16"), 64, rng);
    auto i1 = sparse_indices(numel("w1.u8"), 55, rng);
    const auto w0 = changed_words(reg, reg.id("w2.bf16"), i0, rng);
    const auto w1 = changed_words(reg, reg.id("w1.u8"), i1, rng);
    c.items.push_back(make_golden_item(reg, "w2.bf16", encoding::xor_mask, std::move(i0), w0));
    c.items.push_back(make_golden_item(reg, "w1.u8", encoding::overwrite, std::move(i1), w1));
    c.expect_location = location_coding::bitmap;
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("full_tensor_runs",
                              "Fully changed tensors, each one run, for which the encoder chooses "
                              "the runs location coding by itself.");
    std::mt19937_64 rng(9);
    for (const auto& [n, enc] : {std::pair{"w4.f32", encoding::overwrite}, std::pair{"w1.u8", encoding::ulp},
                                 std::pair{"w8.f64", encoding::xor_mask}}) {
      auto idx = all_indices(numel(n));
      const auto w = changed_words(reg, reg.id(n), idx, rng);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    }
    c.expect_location = location_coding::runs;
    cases.push_back(std::move(c));
  }
  for (const auto& [enc, ename] : encoding_names) {
    golden_case c = base_case("special_patterns_" + std::string(ename),
                              "New bits with a meaning of their own, in " + std::string(ename) +
                                  ": -0, +0, infinities, quiet and signalling NaNs with payloads, "
                                  "subnormals and the largest finite value of every float dtype.");
    for (const char* n : {"w2.bf16", "w2.f16", "w4.f32", "w8.f64", "w1.f8_e4m3", "w1.f8_e5m2"}) {
      const auto words = special_words(reg.at(reg.id(n)).type);
      std::vector<std::uint64_t> idx;
      for (std::size_t k = 0; k < words.size(); ++k) idx.push_back(2 * k + k % 2);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), words));
    }
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("integer_dtypes",
                              "Integer and boolean tensors: bool flags flipped by overwrite, i16 "
                              "and i64 counters stepped by ulp, u32 words by xor_mask.");
    std::mt19937_64 rng(10);
    std::vector<std::uint64_t> bi = {1, 2, 5, 11, 19}, bw;
    for (const auto i : bi) bw.push_back(base_word(reg.id("w1.bool"), i, 1) & 1 ? 0 : 1);
    c.items.push_back(make_golden_item(reg, "w1.bool", encoding::overwrite, bi, bw));
    for (const auto& [n, enc] : {std::pair{"w2.i16", encoding::ulp}, std::pair{"w8.i64", encoding::ulp},
                                 std::pair{"w4.u32", encoding::xor_mask}}) {
      auto idx = sparse_indices(numel(n), 7, rng);
      std::vector<std::uint64_t> w;
      const auto wb = dcr::dtype_size(reg.at(reg.id(n)).type);
      for (const auto i : idx) w.push_back((base_word(reg.id(n), i, wb) + 1 + rng() % 5) & width_mask(wb));
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    }
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("training_step",
                              "A training-step-like update: 120 of 4096 bf16 weights moved by a few "
                              "representable values (ulp), and a sparse xor item; default options.");
    std::mt19937_64 rng(11);
    auto idx = sparse_indices(numel("big.bf16"), 120, rng);
    std::vector<std::uint64_t> w;
    const auto id = reg.id("big.bf16");
    for (const auto i : idx) {
      const auto k = dcr::order_key<std::uint16_t>(static_cast<std::uint16_t>(base_word(id, i, 2)));
      const auto step = static_cast<std::uint16_t>(1 + rng() % 4);
      w.push_back(dcr::order_unkey<std::uint16_t>(static_cast<std::uint16_t>(rng() % 2 ? k + step : k - step)));
    }
    c.items.push_back(make_golden_item(reg, "big.bf16", encoding::ulp, std::move(idx), w));
    auto i1 = sparse_indices(numel("w2.bf16"), 12, rng);
    const auto w1 = changed_words(reg, reg.id("w2.bf16"), i1, rng);
    c.items.push_back(make_golden_item(reg, "w2.bf16", encoding::xor_mask, std::move(i1), w1));
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("sectioned_streams",
                              "A value stream whose sections of 128 bytes and more each start a "
                              "zstd block of their own: 160 overwrite records of bf16 words in "
                              "byte_planes (two planes of 160 bytes, two blocks), skip_buckets "
                              "locations.");
    c.options.location = location_coding::skip_buckets;
    c.options.value = value_coding::byte_planes;
    std::mt19937_64 rng(16);
    auto idx = sparse_indices(numel("big.bf16"), 160, rng);
    const auto w = changed_words(reg, reg.id("big.bf16"), idx, rng);
    c.items.push_back(make_golden_item(reg, "big.bf16", encoding::overwrite, std::move(idx), w));
    c.expect_location = location_coding::skip_buckets;
    c.expect_value = value_coding::byte_planes;
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("exact_choice",
                              "codec_options.exact_choice: every candidate coding compressed and "
                              "the smallest kept.");
    c.options.exact_choice = true;
    std::mt19937_64 rng(12);
    for (const auto& [n, enc] : {std::pair{"big.bf16", encoding::ulp}, std::pair{"w4.f32", encoding::xor_mask},
                                 std::pair{"w8.u64", encoding::overwrite}}) {
      auto idx = n == std::string("big.bf16") ? sparse_indices(numel(n), 40, rng) : clustered_indices(numel(n), 12, rng);
      const auto w = changed_words(reg, reg.id(n), idx, rng);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    }
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("zstd_level_3",
                              "zstd level 3 with the level's own match-finder table "
                              "(codec_options.zstd_level = 3, zstd_hash_log = 0).");
    c.options.zstd_level = 3;
    c.options.zstd_hash_log = 0;
    std::mt19937_64 rng(13);
    for (const auto& [n, enc] : {std::pair{"big.bf16", encoding::xor_mask}, std::pair{"w2.i16", encoding::ulp}}) {
      auto idx = sparse_indices(numel(n), n == std::string("big.bf16") ? 60 : 10, rng);
      const auto w = changed_words(reg, reg.id(n), idx, rng);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    }
    cases.push_back(std::move(c));
  }
  {
    golden_case c = base_case("header_extremes",
                              "Header fields at their extremes: versions near 2^64, attempt "
                              "2^32 - 1, and owner and sequence numbers using every byte.");
    c.header.id = {.attempt = {.base_version = ~0ull - 1, .target_version = ~0ull, .number = 0xffffffffu},
                   .owner = 0x12345678u, .sequence = 0xfedcba98u};
    std::mt19937_64 rng(14);
    auto idx = sparse_indices(numel("w4.i32"), 5, rng);
    const auto w = changed_words(reg, reg.id("w4.i32"), idx, rng);
    c.items.push_back(make_golden_item(reg, "w4.i32", encoding::xor_mask, std::move(idx), w));
    cases.push_back(std::move(c));
  }
  {
    // The payload most error cases are made from: entry 0 and 1 name two tensors of one dtype and
    // numel (for the duplicated-tensor error).
    golden_case c = base_case("error_base",
                              "The valid payload most cases of tests/golden-errors/ are edited from: "
                              "four items in the encoder's own codings.");
    std::mt19937_64 rng(15);
    for (const auto& [n, enc] : {std::pair{"w2.bf16", encoding::xor_mask}, std::pair{"w2.bf16_t", encoding::overwrite},
                                 std::pair{"big.bf16", encoding::ulp}, std::pair{"w4.f32", encoding::overwrite}}) {
      auto idx = sparse_indices(numel(n), n == std::string("big.bf16") ? 30 : 9, rng);
      const auto w = changed_words(reg, reg.id(n), idx, rng);
      c.items.push_back(make_golden_item(reg, n, enc, std::move(idx), w));
    }
    cases.push_back(std::move(c));
  }

  for (auto& c : cases) encode_case(c);
  return cases;
}

// ======================================================================= error cases

void put(bytes_t& b, std::size_t off, std::uint64_t v, std::size_t n) {
  if (off + n > b.size()) fail("put beyond the payload");
  for (std::size_t k = 0; k < n; ++k) b[off + k] = static_cast<std::byte>(v >> (8 * k));
}
/// Recomputes the XXH3-64 trailer, so that a check after the checksum sees the edit.
void reseal(bytes_t& b) { put(b, b.size() - 8, XXH3_64bits(b.data(), b.size() - 8), 8); }

std::size_t entry_at(std::size_t i) { return dcr::payload_format::header_size + i * dcr::payload_format::entry_size; }

std::uint64_t read_leb128(const bytes_t& in, std::size_t& pos) {
  std::uint64_t v = 0;
  for (unsigned shift = 0;; shift += 7) {
    const auto byte = std::to_integer<std::uint64_t>(in.at(pos++));
    v |= (byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
}

/// A bucket sequence of docs/format.md ("Bucket sequences"), read and written from its formulas.
struct bucket_sequence {
  unsigned m = 0;
  std::vector<std::uint64_t> values;
  std::size_t extra_bits = 0;  ///< E, their total
};

unsigned bit_length(std::uint64_t v) {
  unsigned n = 0;
  for (; v != 0; v >>= 1) ++n;
  return n;
}

bucket_sequence read_buckets(const bytes_t& raw, std::size_t pos, std::size_t n) {
  bucket_sequence s;
  s.m = std::to_integer<unsigned>(raw.at(pos)) & 7;
  const std::size_t symbols = pos + 1, extra = symbols + n;
  std::size_t bit = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const auto t = std::to_integer<std::uint64_t>(raw.at(symbols + k));
    if (t < (2u << s.m)) {
      s.values.push_back(t);
      continue;
    }
    const unsigned len = s.m + 2 + static_cast<unsigned>((t - (2u << s.m)) >> s.m);
    const unsigned e = len - 1 - s.m;
    std::uint64_t x = 0;
    for (unsigned b = 0; b < e; ++b, ++bit)
      x |= static_cast<std::uint64_t>((std::to_integer<unsigned>(raw.at(extra + bit / 8)) >> (bit % 8)) & 1) << b;
    s.values.push_back((((std::uint64_t{1} << s.m) + ((t - (2u << s.m)) & ((1u << s.m) - 1))) << e) | x);
  }
  s.extra_bits = bit;
  return s;
}

bytes_t write_buckets(const std::vector<std::uint64_t>& values, unsigned m) {
  bytes_t out = {static_cast<std::byte>(m)};
  std::vector<bool> bits;
  for (const auto v : values) {
    const unsigned len = bit_length(v);
    if (len <= m + 1) {
      out.push_back(static_cast<std::byte>(v));
      continue;
    }
    const unsigned e = len - 1 - m;
    out.push_back(static_cast<std::byte>((v >> e) + std::uint64_t{e} * (1u << m)));
    for (unsigned b = 0; b < e; ++b) bits.push_back(((v >> b) & 1) != 0);
  }
  bytes_t extra((bits.size() + 7) / 8);
  for (std::size_t i = 0; i < bits.size(); ++i)
    if (bits[i]) extra[i / 8] |= static_cast<std::byte>(1u << (i % 8));
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

struct error_case {
  std::string name;
  std::string description;
  errc expected;
  std::string derived_from;  // a golden case, or "" when made otherwise
  std::string edit;
  bytes_t payload;
};

const golden_case& find_case(const std::vector<golden_case>& cases, const std::string& name) {
  for (const auto& c : cases)
    if (c.name == name) return c;
  fail("no golden case " + name);
}

/// Replaces the raw content of one stream of entry `i` (the value stream if `value`) by
/// edit(raw), compressed again as one zstd frame at level 1; updates the entry's sizes, the total
/// size and the checksum.
bytes_t edit_stream(const bytes_t& payload, std::size_t i, bool value,
                    const std::function<void(bytes_t&)>& edit) {
  std::vector<dcr::item_entry> table;
  dcr::payload_decoder::read_table(payload, table);
  const dcr::item_entry& e = table.at(i);
  const std::uint64_t off = value ? e.value_offset : e.location_offset;
  const std::uint64_t size = value ? e.value_size : e.location_size;
  bytes_t raw(value ? e.value_raw_size : e.location_raw_size);
  if (ZSTD_decompress(raw.data(), raw.size(), payload.data() + off, size) != raw.size())
    fail("edit_stream: cannot decompress the stream");
  edit(raw);
  bytes_t frame(ZSTD_compressBound(raw.size()));
  const std::size_t n = ZSTD_compress(frame.data(), frame.size(), raw.data(), raw.size(), 1);
  if (ZSTD_isError(n)) fail("edit_stream: zstd failed");
  frame.resize(n);
  bytes_t out(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(off));
  out.insert(out.end(), frame.begin(), frame.end());
  out.insert(out.end(), payload.begin() + static_cast<std::ptrdiff_t>(off + size), payload.end());
  const std::size_t field = entry_at(i) + (value ? 40 : 24);
  put(out, field, frame.size(), 8);
  put(out, field + 8, raw.size(), 8);
  put(out, 56, out.size(), 8);
  reseal(out);
  return out;
}

/// The first entry of `c` with location coding `lc` (and at least `min_count` records).
std::size_t entry_with(const golden_case& c, location_coding lc, std::size_t min_count = 1) {
  for (std::size_t i = 0; i < c.table.size(); ++i)
    if (c.table[i].location_code == static_cast<std::uint8_t>(lc) && c.table[i].count >= min_count) return i;
  fail(c.name + ": no entry in location coding " + name_of(location_names, lc));
}

errc decode_error(const bytes_t& b, const dcr::tensor_registry& r, const dcr::attempt_key* f) {
  dcr::payload_decoder dec;
  std::vector<item> items;
  try {
    dec.decode(b, r, items, f);
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return errc::ok;
}

std::vector<error_case> error_cases(const std::vector<golden_case>& cases) {
  std::vector<error_case> out;
  const dcr::tensor_registry reg = golden_registry();
  const golden_case& base = find_case(cases, "error_base");
  const bytes_t& good = base.payload;
  const auto add = [&](std::string name, errc expected, std::string description, std::string from,
                       std::string edit, bytes_t payload) {
    out.push_back({std::move(name), std::move(description), expected, std::move(from), std::move(edit),
                   std::move(payload)});
  };
  const auto patched = [&](std::size_t off, std::uint64_t v, std::size_t n, bool seal) {
    bytes_t b = good;
    put(b, off, v, n);
    if (seal) reseal(b);
    return b;
  };
  const std::string at = "error_base";
  const auto entry = [](std::size_t i, std::size_t field) { return entry_at(i) + field; };

  // ---- Header and framing (docs/format.md validation steps 1 to 11).
  add("bad_magic", errc::corrupt_payload, "The magic number is not \"DCRP\".", at,
      "byte 0 set to 0x45 ('E'); checksum recomputed", patched(0, 0x45, 1, true));
  {
    bytes_t b = good;
    const std::size_t off = static_cast<std::size_t>(base.table[2].value_offset) + 6;
    b[off] ^= std::byte{0x10};
    add("checksum_mismatch", errc::corrupt_payload,
        "One bit flipped inside a value stream; the checksum no longer matches.", at,
        "byte " + std::to_string(off) + " (value stream of item 2) xor 0x10; checksum not recomputed", b);
  }
  {
    bytes_t b = good;
    b[b.size() - 3] ^= std::byte{0x01};
    add("checksum_trailer_damaged", errc::corrupt_payload, "One bit flipped in the checksum itself.", at,
        "byte " + std::to_string(b.size() - 3) + " (inside the XXH3-64 trailer) xor 0x01", b);
  }
  add("truncated_in_header", errc::truncated_payload, "Cut to 40 bytes, inside the header.", at,
      "first 40 bytes only", bytes_t(good.begin(), good.begin() + 40));
  add("truncated_in_streams", errc::truncated_payload,
      "Cut 20 bytes before its end, inside the streams.", at,
      "last 20 bytes removed (Total_Size still says " + std::to_string(good.size()) + ")",
      bytes_t(good.begin(), good.end() - 20));
  {
    bytes_t b = good;
    b.push_back(std::byte{0});
    add("trailing_byte", errc::corrupt_payload,
        "One byte after the declared end (Total_Size smaller than the bytes received).", at,
        "a zero byte appended", b);
  }
  add("wrong_version", errc::unsupported_version, "Format_Version 2.", at,
      "bytes 4-5 set to 2; checksum recomputed", patched(4, 2, 2, true));
  add("wrong_header_size", errc::corrupt_payload, "Header_Size 96 instead of 80.", at,
      "bytes 8-9 set to 96; checksum recomputed", patched(8, 96, 2, true));
  add("header_flags_set", errc::reserved_bits_set, "Header_Flags (reserved) not zero.", at,
      "bytes 6-7 set to 0x0100; checksum recomputed", patched(6, 0x0100, 2, true));
  add("header_reserved_set", errc::reserved_bits_set,
      "A reserved header byte (offset 12) not zero.", at,
      "byte 12 set to 1; checksum recomputed", patched(12, 1, 1, true));
  add("header_reserved_tail_set", errc::reserved_bits_set,
      "The last reserved header byte (offset 79) not zero.", at,
      "byte 79 set to 0x80; checksum recomputed", patched(79, 0x80, 1, true));
  add("item_count_overflow", errc::overflow,
      "Item_Count 2^32 - 1: more entries than Total_Size can hold.", at,
      "bytes 52-55 set to 0xffffffff; checksum recomputed", patched(52, 0xffffffffu, 4, true));
  add("entry_reserved_set", errc::reserved_bits_set,
      "The reserved field of entry 1 not zero.", at,
      "bytes " + std::to_string(entry(1, 56)) + "-" + std::to_string(entry(1, 63)) +
          " set to 2^63; checksum recomputed",
      patched(entry(1, 56), 1ull << 63, 8, true));
  add("stream_overrun", errc::corrupt_payload,
      "Entry 3's value stream size runs past the checksum.", at,
      "Value_Size of entry 3 (bytes " + std::to_string(entry(3, 40)) + "-) set to the payload size; checksum recomputed",
      patched(entry(3, 40), good.size(), 8, true));
  add("streams_short_of_checksum", errc::corrupt_payload,
      "Entry 3's value stream one byte short: the streams end before the checksum.", at,
      "Value_Size of entry 3 decreased by 1; checksum recomputed",
      patched(entry(3, 40), base.table[3].value_size - 1, 8, true));

  {
    // A second (empty) zstd frame after entry 0's location frame, inside its Location_Size.
    bytes_t extra(ZSTD_compressBound(0));
    extra.resize(ZSTD_compress(extra.data(), extra.size(), nullptr, 0, 1));
    bytes_t b = good;
    const auto end = static_cast<std::ptrdiff_t>(base.table[0].location_offset + base.table[0].location_size);
    b.insert(b.begin() + end, extra.begin(), extra.end());
    put(b, entry(0, 24), base.table[0].location_size + extra.size(), 8);
    put(b, 56, b.size(), 8);
    reseal(b);
    add("two_frames_in_stream", errc::corrupt_payload,
        "Entry 0's location stream is its frame followed by a second, empty zstd frame.", at,
        "an empty zstd frame (" + std::to_string(extra.size()) + " bytes) inserted at byte " +
            std::to_string(end) + ", Location_Size of entry 0 and Total_Size increased to match; "
            "checksum recomputed",
        b);
  }

  // ---- Against the receiver and the registry (steps 12 to 15).
  add("stale_attempt", errc::stale_payload,
      "A payload of attempt 2 delivered to a receiver at attempt 3 of the same transition (a "
      "fenced attempt's late payload); without a transition filter it decodes.",
      at, "Attempt (bytes 40-43) set to 2; checksum recomputed", patched(40, 2, 4, true));
  add("stale_transition", errc::stale_payload,
      "A payload of transition 40 -> 41 delivered to a receiver at 41 -> 42.", at,
      "Base_Version 40, Target_Version 41; checksum recomputed", [&] {
        bytes_t b = good;
        put(b, 24, 40, 8);
        put(b, 32, 41, 8);
        reseal(b);
        return b;
      }());
  {
    std::vector<dcr::canonical_tensor> other(reg.tensors().begin(), reg.tensors().end());
    other.push_back({"w9.extra", dtype::f32, {4}});
    const dcr::tensor_registry other_reg(std::move(other));
    dcr::payload_encoder enc(base.options);
    bytes_t b;
    enc.encode(header_for(other_reg), base.items, other_reg, b);
    add("registry_mismatch", errc::registry_mismatch,
        "The items of error_base encoded for another model (the same tensors plus 'w9.extra' "
        "f32 [4]): its registry fingerprint is not the receiver's.",
        "", "encoded by payload_encoder for the other registry (fingerprint " +
                fingerprint_text(other_reg.fingerprint()) + ")",
        b);
  }
  add("unknown_tensor", errc::unknown_tensor,
      "Entry 2 names tensor id 16; the registry has 16 tensors (ids 0 to 15).", at,
      "Tensor_Id of entry 2 set to 16; checksum recomputed",
      patched(entry(2, 0), reg.size(), 4, true));
  add("dtype_mismatch", errc::dtype_mismatch,
      "Entry 0 says F16 (code 2) for a BF16 tensor.", at,
      "Dtype of entry 0 set to 2; checksum recomputed", patched(entry(0, 4), 2, 1, true));
  add("unknown_encoding", errc::unsupported_version, "Entry 1 uses encoding code 3.", at,
      "Encoding of entry 1 set to 3; checksum recomputed", patched(entry(1, 5), 3, 1, true));
  add("unknown_location_coding", errc::unsupported_version,
      "Entry 2 uses location coding code 4.", at,
      "Location_Coding of entry 2 set to 4; checksum recomputed", patched(entry(2, 6), 4, 1, true));
  add("unknown_value_coding", errc::unsupported_version, "Entry 3 uses value coding code 5.", at,
      "Value_Coding of entry 3 set to 5; checksum recomputed", patched(entry(3, 7), 5, 1, true));
  add("numel_mismatch", errc::shape_mismatch,
      "Entry 2 says Numel 4097; the registry's big.bf16 has 4096 elements.", at,
      "Numel of entry 2 set to 4097; checksum recomputed", patched(entry(2, 16), 4097, 8, true));
  add("count_exceeds_numel", errc::overflow,
      "Entry 0 declares 129 records for a 128-element tensor.", at,
      "Count of entry 0 set to 129; checksum recomputed", patched(entry(0, 8), 129, 8, true));
  add("count_huge", errc::overflow, "Entry 2 declares 2^64 - 1 records.", at,
      "Count of entry 2 set to 0xffffffffffffffff; checksum recomputed",
      patched(entry(2, 8), ~0ull, 8, true));
  add("count_raw_size_mismatch", errc::corrupt_payload,
      "Entry 3 declares one record fewer than its streams hold.",
      at, "Count of entry 3 decreased by 1; checksum recomputed",
      patched(entry(3, 8), base.table[3].count - 1, 8, true));
  add("duplicate_tensor", errc::corrupt_payload,
      "Entries 0 and 1 both name w2.bf16 (entry 1 was w2.bf16_t, of the same dtype and numel).",
      at, "Tensor_Id of entry 1 set to " + std::to_string(reg.id("w2.bf16")) + "; checksum recomputed",
      patched(entry(1, 0), reg.id("w2.bf16"), 4, true));
  add("raw_size_not_frame_content_size", errc::corrupt_payload,
      "Entry 0's Location_Raw_Size is one more than its zstd frame's content size.", at,
      "Location_Raw_Size of entry 0 increased by 1; checksum recomputed",
      patched(entry(0, 32), base.table[0].location_raw_size + 1, 8, true));

  // ---- Stream contents (step 16).
  {
    // A frame whose header claims one byte more than its blocks hold, with the entry agreeing:
    // only decompressing can tell.
    const golden_case& fr = find_case(cases, "first_release_planes");
    const std::size_t i = 0;  // big.bf16, skip_varint
    const auto& e = fr.table[i];
    bytes_t b = fr.payload;
    const auto off = static_cast<std::size_t>(e.location_offset);
    if (std::to_integer<unsigned>(b[off + 4]) != 0x20 || e.location_raw_size + 1 > 255 ||
        e.location_raw_size + 1 > 2 * e.count)
      fail("frame_lies_about_size: unexpected frame layout");
    b[off + 5] = static_cast<std::byte>(e.location_raw_size + 1);
    put(b, entry(i, 32), e.location_raw_size + 1, 8);
    reseal(b);
    add("frame_lies_about_size", errc::corrupt_payload,
        "Item 0's location frame header and Location_Raw_Size both claim one byte more than the "
        "frame's blocks decode to.",
        fr.name,
        "Frame_Content_Size byte " + std::to_string(off + 5) + " and Location_Raw_Size of entry 0 "
        "increased by 1; checksum recomputed",
        b);
  }
  {
    const golden_case& fr = find_case(cases, "first_release_planes");
    bytes_t b = edit_stream(fr.payload, 0, false, [](bytes_t& raw) {
      for (std::size_t k = 0; k < raw.size(); ++k)
        if (std::to_integer<unsigned>(raw[k]) < 0x80 && (k == 0 || std::to_integer<unsigned>(raw[k - 1]) < 0x80)) {
          raw[k] |= std::byte{0x80};
          raw.insert(raw.begin() + static_cast<std::ptrdiff_t>(k) + 1, std::byte{0});
          return;
        }
      fail("varint_not_minimal: no one-byte varint");
    });
    add("varint_not_minimal", errc::corrupt_payload,
        "A skip_varint skip written in two bytes (low group | 0x80, then 0x00): not minimal.", fr.name,
        "location stream of item 0: its first one-byte varint v replaced by v | 0x80, 0x00; "
        "recompressed, sizes and checksum recomputed",
        b);
  }
  {
    const golden_case& bm = find_case(cases, "coding_bitmap__byte_planes");
    const std::size_t i = entry_with(bm, location_coding::bitmap, 2);
    bytes_t b = edit_stream(bm.payload, i, false, [](bytes_t& raw) {
      for (auto& x : raw)  // clear one set bit, not in the last byte (which must stay non-zero)
        if (&x != &raw.back() && x != std::byte{0}) {
          x &= static_cast<std::byte>(std::to_integer<unsigned>(x) - 1);
          return;
        }
      fail("bitmap_popcount_mismatch: no bit to clear");
    });
    add("bitmap_popcount_mismatch", errc::corrupt_payload,
        "A bitmap with one bit fewer than the entry's Count.", bm.name,
        "location stream of item " + std::to_string(i) +
            ": lowest set bit of its first non-zero byte cleared; recompressed, sizes and checksum "
            "recomputed",
        b);
  }
  {
    const golden_case& rn = find_case(cases, "coding_runs__byte_planes");
    const std::size_t i = entry_with(rn, location_coding::runs, 4);
    bytes_t b = edit_stream(rn.payload, i, false, [](bytes_t& raw) {
      std::size_t pos = 0;
      const std::uint64_t runs = read_leb128(raw, pos);
      if (runs < 2) fail("runs_not_maximal: one run");
      bucket_sequence s = read_buckets(raw, pos, 2 * runs);
      s.values[1] = 0;  // the second run starts right where the first ends
      bytes_t edited(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(pos));
      const bytes_t seq = write_buckets(s.values, s.m);
      edited.insert(edited.end(), seq.begin(), seq.end());
      raw = edited;
    });
    add("runs_not_maximal", errc::corrupt_payload,
        "Two runs that touch (run skip 0 after the first run): runs must be maximal.", rn.name,
        "location stream of item " + std::to_string(i) +
            ": the second run's skip set to 0, bucket sequence rewritten with the same M; "
            "recompressed, sizes and checksum recomputed",
        b);
  }
  {
    const golden_case& sb = find_case(cases, "coding_skip_buckets__byte_planes");
    const std::size_t i = entry_with(sb, location_coding::skip_buckets);
    bytes_t b = edit_stream(sb.payload, i, false, [](bytes_t& raw) { raw[0] |= std::byte{0x08}; });
    add("bucket_header_reserved_bits", errc::reserved_bits_set,
        "A skip_buckets Bucket_Header with reserved bit 3 set.", sb.name,
        "location stream of item " + std::to_string(i) +
            ": byte 0 | 0x08; recompressed, sizes and checksum recomputed",
        b);
  }
  {
    // The first skip_buckets entry, over all golden cases, whose extra bits leave padding in
    // their last byte.
    const golden_case* sb = nullptr;
    std::size_t pick = 0;
    for (const auto& c : cases) {
      for (std::size_t i = 0; i < c.table.size() && sb == nullptr; ++i) {
        const auto& e = c.table[i];
        if (e.location_code != static_cast<std::uint8_t>(location_coding::skip_buckets) || e.count == 0) continue;
        bytes_t raw(e.location_raw_size);
        ZSTD_decompress(raw.data(), raw.size(), c.payload.data() + e.location_offset, e.location_size);
        if (read_buckets(raw, 0, static_cast<std::size_t>(e.count)).extra_bits % 8 != 0) {
          sb = &c;
          pick = i;
        }
      }
      if (sb != nullptr) break;
    }
    if (sb == nullptr) fail("extra_bits_padding_set: no skip_buckets entry with padding");
    std::size_t padding_bit = 0;
    bytes_t b = edit_stream(sb->payload, pick, false, [&](bytes_t& raw) {
      const bucket_sequence s = read_buckets(raw, 0, static_cast<std::size_t>(sb->table[pick].count));
      padding_bit = s.extra_bits % 8;
      raw.back() |= static_cast<std::byte>(0x80u);
    });
    add("extra_bits_padding_set", errc::reserved_bits_set,
        "The padding after a bucket sequence's extra bits not zero.", sb->name,
        "location stream of item " + std::to_string(pick) + ": bit 7 of its last byte (padding from bit " +
            std::to_string(padding_bit) + ") set; recompressed, sizes and checksum recomputed",
        b);
  }
  {
    const golden_case& vb = find_case(cases, "coding_skip_buckets__buckets");
    std::size_t pick = vb.table.size();
    for (std::size_t i = 0; i < vb.table.size(); ++i)
      if (vb.table[i].dtype_code == static_cast<std::uint8_t>(dtype::f16)) pick = i;
    bytes_t b = edit_stream(vb.payload, pick, true, [](bytes_t& raw) { raw[1] = std::byte{0xff}; });
    add("value_symbol_too_long", errc::corrupt_payload,
        "A value bucket symbol (0xff) for a bit length beyond the 16-bit word.", vb.name,
        "value stream of item " + std::to_string(pick) +
            " (w2.f16): first symbol set to 0xff; recompressed, sizes and checksum recomputed",
        b);
  }
  // Out-of-range indices, one per location coding: the item is encoded for a twin model in which
  // w1.u8 has 101 elements, with its last record at index 100, then relabelled for the real
  // model (fingerprint and Numel 100) and resealed. 100 is not a multiple of 8, so the bitmap's
  // size is still possible for 100 elements and only the index check can refuse it.
  for (const auto& [lc, lname] : location_names) {
    std::vector<dcr::canonical_tensor> twin(reg.tensors().begin(), reg.tensors().end());
    for (auto& t : twin)
      if (t.name == "w1.u8") t.shape = {101};
    const dcr::tensor_registry twin_reg(std::move(twin));
    const std::vector<std::uint64_t> idx = {1, 2, 3, 10, 40, 41, 97, 98, 99, 100};
    std::vector<std::uint64_t> w;
    for (std::size_t k = 0; k < idx.size(); ++k) w.push_back(0x10 + k);
    const dcr::tensor_id id = twin_reg.id("w1.u8");
    std::vector<std::uint8_t> old_w(idx.size()), new_w(w.begin(), w.end());
    const std::vector<item> items = {
        dcr::make_item<std::uint8_t>(id, dtype::u8, encoding::overwrite, idx, old_w, new_w)};
    dcr::payload_encoder enc({.location = lc});
    bytes_t b;
    enc.encode(header_for(twin_reg), items, twin_reg, b);
    std::vector<dcr::item_entry> table;
    dcr::payload_decoder::read_table(b, table);
    if (table[0].location_code != static_cast<std::uint8_t>(lc)) fail("out_of_range: coding not used");
    put(b, 16, reg.fingerprint(), 8);
    put(b, entry(0, 16), 100, 8);
    reseal(b);
    add("out_of_range_" + std::string(lname), errc::out_of_range,
        "An index equal to Numel (100) in location coding " + std::string(lname) + ".", "",
        "an overwrite item of w1.u8 at indices 1-3, 10, 40-41, 97-100 encoded (location coding " +
            std::string(lname) +
            ") for a twin registry in which w1.u8 has 101 elements; Registry_Fingerprint set to the "
            "golden registry's and Numel of entry 0 to 100; checksum recomputed",
        b);
  }

  // Every case fails as documented: decoding with the receiver's transition filter, and (except
  // the stale ones) without a filter too.
  for (const auto& c : out) {
    const errc with = decode_error(c.payload, reg, &receiver_attempt);
    const errc without = decode_error(c.payload, reg, nullptr);
    const errc want_without = c.expected == errc::stale_payload ? errc::ok : c.expected;
    if (with != c.expected || without != want_without)
      fail("error case " + c.name + ": decoding gives " + name_of(errc_names, with) + " / " +
           name_of(errc_names, without) + ", expected " + name_of(errc_names, c.expected));
  }
  return out;
}

json error_sidecar(const error_case& c, const dcr::tensor_registry& reg) {
  json j;
  j["description"] = c.description;
  j["expected_error"] = name_of(errc_names, c.expected);
  j["derived_from"] = c.derived_from.empty() ? json(nullptr) : json(std::string(golden_dir) + "/" + c.derived_from + std::string(payload_ext));
  j["edit"] = c.edit;
  j["payload_bytes"] = c.payload.size();
  j["receiver_attempt"] = {{"base_version", receiver_attempt.base_version},
                           {"target_version", receiver_attempt.target_version},
                           {"attempt", receiver_attempt.number}};
  j["registry"] = registry_json(reg);
  j["registry_fingerprint"] = fingerprint_text(reg.fingerprint());
  return j;
}

// ======================================================================= output

struct output_file {
  std::filesystem::path path;
  std::string bytes;
};

std::string as_string(const bytes_t& b) {
  std::string s(b.size(), '\0');
  std::memcpy(s.data(), b.data(), b.size());
  return s;
}

int run(int argc, char** argv) {
  std::optional<std::filesystem::path> out_dir;
  bool force = false;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--out" && a + 1 < argc) {
      out_dir = argv[++a];
    } else if (arg == "--force") {
      force = true;
    } else {
      std::cerr << "usage: make_golden --out DIR [--force]\n"
                   "  writes DIR/golden/ and DIR/golden-errors/ (run with --out tests from the "
                   "repository root);\n  refuses to overwrite existing files unless --force\n";
      return 2;
    }
  }
  if (!out_dir) {
    std::cerr << "make_golden: --out DIR is required\n";
    return 2;
  }

  const std::vector<golden_case> cases = golden_cases();
  const std::vector<error_case> errors = error_cases(cases);
  std::vector<output_file> files;
  const auto golden = *out_dir / golden_dir, bad = *out_dir / errors_dir;
  for (const auto& c : cases) {
    files.push_back({golden / (c.name + std::string(payload_ext)), as_string(c.payload)});
    files.push_back({golden / (c.name + std::string(sidecar_ext)), sidecar_text(golden_sidecar(c))});
  }
  const dcr::tensor_registry reg = golden_registry();
  for (const auto& c : errors) {
    files.push_back({bad / (c.name + std::string(payload_ext)), as_string(c.payload)});
    files.push_back({bad / (c.name + std::string(sidecar_ext)), sidecar_text(error_sidecar(c, reg))});
  }

  if (!force) {
    std::size_t existing = 0;
    for (const auto& f : files)
      if (std::filesystem::exists(f.path)) {
        if (existing++ == 0) std::cerr << "make_golden: " << f.path.string() << " exists";
      }
    if (existing > 0) {
      std::cerr << " (and " << existing - 1
                << " more): golden files are produced once; pass --force to overwrite them\n";
      return 1;
    }
  }
  std::filesystem::create_directories(golden);
  std::filesystem::create_directories(bad);
  std::size_t total = 0;
  for (const auto& f : files) {
    std::ofstream o(f.path, std::ios::binary | std::ios::trunc);
    o.write(f.bytes.data(), static_cast<std::streamsize>(f.bytes.size()));
    if (!o) fail("cannot write " + f.path.string());
    total += f.bytes.size();
  }
  std::cout << "make_golden: " << cases.size() << " golden and " << errors.size()
            << " error cases (" << files.size() << " files, " << total << " bytes) under "
            << out_dir->string() << ", zstd " << ZSTD_versionString() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
