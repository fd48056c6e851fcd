// tests/fuzz/seeds.hpp: the seed corpus of the payload fuzz target, generated rather than stored
// so it always matches the current encoder and format.
//
// Seeds are valid payloads made with payload_encoder for the fuzz model (every tensor, every
// supported encoding, items without records, a large item, an item the loader must refuse as
// xor), each in the raw and fixed input modes and under two encoder settings, plus recipes
// (recipe.hpp), some with byte edits. Starting from valid structure lets the fuzzer reach the
// item table, the frames and the apply path instead of stopping at the magic or the checksum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "fuzz_model.hpp"
#include "recipe.hpp"

namespace dcr_fuzz {

struct seed {
  std::string name;
  std::vector<std::uint8_t> bytes;  ///< a fuzz input: mode byte, then body
};

namespace detail {

inline dcr::item seed_item(const dcr::tensor_registry& registry, dcr::tensor_id id,
                           dcr::encoding enc, std::vector<std::uint64_t> indices,
                           std::uint64_t value_seed) {
  dcr::item it;
  it.tensor = id;
  it.type = registry.tensors()[id].type;
  it.enc = enc;
  it.indices = std::move(indices);
  it.values.resize(it.count() * it.word_bytes());
  for (auto& b : it.values) {
    value_seed = value_seed * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::byte>(value_seed >> 56);
  }
  return it;
}

inline std::vector<std::uint64_t> spread(std::uint64_t numel, std::uint64_t n) {
  std::vector<std::uint64_t> v;
  if (numel == 0) return v;
  n = std::min(n, numel);
  for (std::uint64_t j = 0; j < n; ++j) {
    const std::uint64_t i = n == 1 ? 0 : j * (numel - 1) / (n - 1);
    if (v.empty() || v.back() < i) v.push_back(i);
  }
  return v;
}

inline std::vector<std::uint64_t> all(std::uint64_t numel) {
  std::vector<std::uint64_t> v(numel);
  for (std::uint64_t i = 0; i < numel; ++i) v[i] = i;
  return v;
}

}  // namespace detail

/// The seed corpus for the fuzz model's registry.
inline std::vector<seed> seed_inputs() {
  const dcr::tensor_registry registry = make_registry();
  const auto& encs = supported_encodings();
  const auto numel = [&](dcr::tensor_id id) {
    return static_cast<std::uint64_t>(registry.tensors()[id].numel());
  };

  // Item sets.
  std::vector<std::pair<std::string, std::vector<dcr::item>>> sets;
  sets.push_back({"no-items", {}});
  {
    std::vector<dcr::item> v;
    for (dcr::tensor_id id = 0; id < tensor_count; ++id)
      v.push_back(detail::seed_item(registry, id, encs[id % encs.size()],
                                    detail::spread(numel(id), 3), id));
    sets.push_back({"every-tensor", std::move(v)});
  }
  {
    std::vector<dcr::item> v;
    for (dcr::tensor_id id = 0; id < tensor_count; ++id)
      v.push_back(detail::seed_item(registry, id, encs[(id + 1) % encs.size()], {}, id));
    sets.push_back({"empty-items", std::move(v)});
  }
  {
    std::vector<dcr::item> v;
    for (dcr::tensor_id id = 0; id < id_large; ++id)
      if (id != id_f)
        v.push_back(detail::seed_item(registry, id, encs[(id + 2) % encs.size()],
                                      detail::all(numel(id)), 100 + id));
    sets.push_back({"dense-small", std::move(v)});
  }
  for (const dcr::encoding e : encs) {
    // Scattered records over rows 0 and 1, all of row 2 (both held by this rank from row 1),
    // and a few far rows.
    const auto cols = static_cast<std::uint64_t>(large_cols);
    std::vector<std::uint64_t> idx = detail::spread(2 * cols, 500);
    for (std::uint64_t i = 0; i < cols; ++i) idx.push_back(2 * cols + i);
    for (std::uint64_t r = 100; r < 4000; r += 700) idx.push_back(r * cols + r % cols);
    std::vector<dcr::item> v;
    v.push_back(detail::seed_item(registry, id_large, e, std::move(idx), 7));
    sets.push_back({"large-enc" + std::to_string(static_cast<int>(e)), std::move(v)});
  }
  for (const dcr::encoding e : encs) {
    std::vector<dcr::item> v;
    v.push_back(detail::seed_item(registry, id_b, dcr::encoding::overwrite, {1, 2, 3}, 1));
    v.push_back(detail::seed_item(registry, id_f, e, {0, 5}, 2));
    sets.push_back({"tied-enc" + std::to_string(static_cast<int>(e)), std::move(v)});
  }

  std::vector<seed> seeds;
  dcr::payload_header header;
  header.id = {6, 7, 0, 3, 1};
  header.registry_fingerprint = registry.fingerprint();
  std::vector<std::byte> payload;
  // Encoder settings, and per setting the mode flags of its seeds: how the round trip
  // re-encodes (bits 3-5) and which apply path runs (bit 6); the fixed variants also verify.
  struct setting {
    const char* name;
    dcr::codec_options options;
    std::uint8_t flags;
  };
  const setting settings[] = {
      {"adaptive", {}, 0x18},
      {"v1-planes-l3", {.zstd_level = 3, .byte_planes = true, .adaptive = false}, 0x40},
      {"v1-raw", {.zstd_level = 1, .byte_planes = false, .adaptive = false}, 0x20 | 0x40}};
  for (const auto& [setting_name, options, flags] : settings) {
    dcr::payload_encoder encoder(options);
    for (const auto& [name, items] : sets) {
      encoder.encode(header, items, registry, payload);
      for (const input_mode m : {input_mode::raw, input_mode::fixed}) {
        seed s;
        s.name = std::string("payload-") + name + "-" + setting_name +
                 (m == input_mode::raw ? "-raw" : "-fixed");
        s.bytes.push_back(static_cast<std::uint8_t>(static_cast<std::uint8_t>(m) | flags |
                                                    (m == input_mode::fixed ? 0x80 : 0)));
        for (std::byte b : payload) s.bytes.push_back(static_cast<std::uint8_t>(b));
        seeds.push_back(std::move(s));
      }
    }
  }

  // Recipes.
  const std::uint8_t gaps[] = {0, 3, 1, 7, 2};
  const auto add = [&](std::string name, const recipe_writer& w) {
    seeds.push_back({"recipe-" + std::move(name), w.bytes()});
  };
  add("three-items", recipe_writer(1, 6, 7, 0, 2, 5, 3)
                         .listed(id_a, 0, gaps, 2, 11)
                         .run(id_c, 1, 2, 1, 6, 9)
                         .none(id_g, 0));
  add("listed-bytes", recipe_writer(2, 1, 2, 1, 0, 0, 2)
                          .listed(id_b, 1, gaps, 1, 5)
                          .listed(id_h, 2, gaps, 8, 6));
  add("large-run", recipe_writer(1, 9, 10, 0, 1, 1, 1).run(id_large, 0, 1000, 0, 5000, 3));
  add("large-run-general-verify", recipe_writer(1, 9, 10, 0, 1, 1, 1, 0xc0)
                                      .run(id_large, 2, 1000, 0, 5000, 3));
  add("tied-general", recipe_writer(0, 1, 2, 0, 0, 0, 2, 0x40)
                          .listed(id_f, 0, gaps, 2, 8)
                          .listed(id_c, 1, gaps, 8, 9));
  // Every location and value coding, forced where it suits (dense, sparse and run items).
  for (int k = 0; k < std::max(known_location_codings, known_value_codings); ++k) {
    const auto codings = static_cast<std::uint8_t>((k % known_location_codings + 1) |
                                                   (k % known_value_codings + 1) << 4);
    add("codings-" + std::to_string(k % known_location_codings) + "-" +
            std::to_string(k % known_value_codings),
        recipe_writer(1, 3, 4, 0, 1, 2, 4, static_cast<std::uint8_t>(k << 6), codings)
            .run(id_a, static_cast<std::uint8_t>(k), 0, 0, 32, 1)
            .listed(id_c, static_cast<std::uint8_t>(k + 1), gaps, 8, 2)
            .run(id_large, static_cast<std::uint8_t>(k + 2), 1000, 0, 3000, 3)
            .run(id_d, static_cast<std::uint8_t>(k), 3, 2, 7, 4));
  }
  add("large-strided", recipe_writer(4, 9, 10, 2, 1, 1, 2)
                           .run(id_large, 1, 900, 6, 2000, 4)
                           .run(id_d, 0, 10, 0, 14, 5));
  // Edits: the first entry's count byte, a location-size byte, a frame byte, a cut; field
  // edits of count, raw sizes and stream sizes; an inserted run; a duplicated entry.
  add("edit-count", recipe_writer(1, 6, 7, 0, 2, 5, 1).listed(id_a, 0, gaps, 2, 11).edit_byte(88, 1));
  add("edit-location-size",
      recipe_writer(1, 6, 7, 0, 2, 5, 1).listed(id_d, 1, gaps, 4, 12).edit_byte(104, 2));
  add("edit-frame",
      recipe_writer(0, 6, 7, 0, 2, 5, 1).run(id_c, 0, 0, 0, 15, 1).edit_byte(150, 0x40));
  add("edit-truncate", recipe_writer(1, 6, 7, 0, 2, 5, 2)
                           .listed(id_a, 0, gaps, 2, 11)
                           .none(id_e, 1)
                           .edit_byte(200, 0));
  add("edit-field-count",
      recipe_writer(1, 6, 7, 0, 2, 5, 2).run(id_large, 0, 5, 0, 300, 2).none(id_b, 0)
          .edit_field(0, 1, 2));
  add("edit-field-raw-sizes", recipe_writer(1, 6, 7, 0, 2, 5, 1)
                                  .run(id_large, 1, 5, 3, 300, 2)
                                  .edit_field(0, 4, 8)
                                  .edit_field(0, 6, 9));
  add("edit-field-stream-size",
      recipe_writer(1, 6, 7, 0, 2, 5, 2).listed(id_h, 0, gaps, 8, 3).listed(id_b, 1, gaps, 1, 4)
          .edit_field(0, 3, 2)
          .edit_field(1, 3, 3));
  add("edit-insert", recipe_writer(1, 6, 7, 0, 2, 5, 1)
                         .listed(id_a, 0, gaps, 2, 11)
                         .edit_insert(180, 3, 0)
                         .edit_field(0, 5, 2));
  add("edit-grow-frame", recipe_writer(9, 6, 7, 0, 2, 5, 2)
                             .listed(id_a, 0, gaps, 2, 11)
                             .listed(id_c, 1, gaps, 8, 12)
                             .edit_grow(1, 0, 0)
                             .edit_grow(0, 1, 4));
  add("edit-rle-frames", recipe_writer(9, 6, 7, 0, 2, 5, 1)
                             .listed(id_b, 0, gaps, 1, 11)
                             .edit_rle(0, 0, 0, 0)
                             .edit_rle(0, 1, 0x3c, 0));
  // Options 9: the first release's codings (skip_varint locations, byte-plane values), which
  // the RLE edits below assume.
  // The largest item the model allows: every element of the 4M-element tensor, as a 1-record
  // item whose count and raw sizes are raised to numel and whose frames become RLE runs (skip 0
  // for every record; one value for all). Decodes, round-trips and applies; hostile only in size.
  add("edit-rle-numel-records", recipe_writer(9, 6, 7, 0, 2, 5, 1)
                                    .run(id_large, 0, 0, 0, 1, 1)
                                    .edit_field(0, 1, 8)   // count = numel
                                    .edit_field(0, 4, 8)   // location raw size = numel
                                    .edit_field(0, 6, 8)   // value raw size = numel
                                    .edit_field(0, 6, 4)   //   ... * 2 (bf16 words)
                                    .edit_rle(0, 0, 0, 0)
                                    .edit_rle(0, 1, 0x3c, 0));
  for (const std::uint8_t drop : {1, 0xff}) {  // one block short; no blocks at all
    add(std::string("edit-rle-") + (drop == 1 ? "short-frame" : "headless-frame"),
        recipe_writer(9, 6, 7, 0, 2, 5, 1)
            .run(id_large, 0, 0, 0, 1, 1)
            .edit_field(0, 1, 10)  // count = 2^20
            .edit_field(0, 4, 10)
            .edit_field(0, 6, 10)
            .edit_field(0, 6, 4)
            .edit_rle(0, 0, 0, drop)
            .edit_rle(0, 1, 0x3c, 0));
  }
  add("edit-copy-entry", recipe_writer(1, 6, 7, 0, 2, 5, 2)
                             .listed(id_a, 0, gaps, 2, 11)
                             .listed(id_f, 0, gaps, 2, 12)
                             .edit_copy(0, 1));
  return seeds;
}

}  // namespace dcr_fuzz
