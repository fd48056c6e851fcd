// tests/fuzz/fuzz_model.hpp: the fixed model the payload fuzz target decodes against, and one
// receiver rank's storage with its native loader.
//
// The registry mixes every word width (1, 2, 4 and 8 bytes), a tensor with no elements, and one
// large tensor (4M elements) so that hostile record counts are bounded only by a real numel. The
// loader places the tensors the way engines do (transposed, replicated, split across ranks,
// skipped, copied twice into one buffer), and `placements()` states the same placement a second
// time as plain index arithmetic: the oracle the fuzz target checks every apply against.
//
// All buffers live in one arena separated by guard bytes, so "storage unchanged" is one compare
// and a write outside any buffer shows up as a changed guard byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr_fuzz {

/// Rows of the large tensor and the row range this rank holds.
inline constexpr std::int64_t large_rows = 4096, large_cols = 1024;
inline constexpr std::int64_t large_held_begin = 1, large_held_rows = 2;

/// The canonical tensors. Ids are positions in name order, which the names below already follow.
inline dcr::tensor_registry make_registry() {
  using dcr::dtype;
  return dcr::tensor_registry({
      {"a.bf16", dtype::bf16, {4, 8}},         // stored transposed
      {"b.f8", dtype::f8_e4m3, {17}},          // stored as is (1-byte words)
      {"c.f64", dtype::f64, {3, 5}},           // replicated into two buffers
      {"d.f32", dtype::f32, {2, 3, 4}},        // this rank holds d[1]
      {"e.u8", dtype::u8, {5}},                // held by another rank: skipped
      {"f.i16", dtype::i16, {6}},              // copied twice into one buffer
      {"g.f32", dtype::f32, {0}},              // no elements
      {"h.u64", dtype::u64, {2, 2}},           // this rank holds column 1
      {"z.large", dtype::bf16, {large_rows, large_cols}},  // this rank holds two rows
  });
}

/// Tensor ids, by name order.
enum tensor_ids : dcr::tensor_id {
  id_a = 0, id_b, id_c, id_d, id_e, id_f, id_g, id_h, id_large, tensor_count
};

/// One rank's storage: named buffers at fixed offsets in one arena, separated by guard bytes.
struct storage {
  struct buffer {
    std::size_t offset;  ///< bytes from the arena start
    std::size_t words;
    std::size_t word_bytes;
  };
  static constexpr std::size_t guard = 64;

  // Buffers in arena order.
  enum : std::size_t { A, B, C1, C2, D, F, G, H, Z, buffer_count };
  buffer buffers[buffer_count]{};
  std::vector<std::uint64_t> arena;  // 8-byte aligned

  storage() {
    const std::size_t sizes[buffer_count][2] = {
        {32, 2}, {17, 1}, {15, 8}, {15, 8}, {12, 4}, {6, 2}, {0, 4}, {2, 8},
        {static_cast<std::size_t>(large_held_rows * large_cols), 2}};
    std::size_t at = guard;
    for (std::size_t b = 0; b < buffer_count; ++b) {
      buffers[b] = {at, sizes[b][0], sizes[b][1]};
      at += (sizes[b][0] * sizes[b][1] + 7) / 8 * 8 + guard;
    }
    arena.resize(at / 8);
  }

  [[nodiscard]] std::byte* bytes() noexcept { return reinterpret_cast<std::byte*>(arena.data()); }
  [[nodiscard]] std::size_t size() const noexcept { return arena.size() * 8; }

  template <class W>
  [[nodiscard]] W* words(std::size_t b) noexcept {
    return reinterpret_cast<W*>(bytes() + buffers[b].offset);
  }

  /// Fills buffers and guards with a fixed pseudo-random pattern (the same on every call).
  void reset() noexcept {
    std::uint64_t s = 0x9e3779b97f4a7c15ull;
    for (auto& w : arena) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      w = s;
    }
  }
};

/// The engine's native loader for this rank, written with tensor views as an engine would.
struct loader {
  using loader_concept = dcr::loader_tag;
  storage* s;

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    using view = dcr::tensor_view<W>;
    const std::string_view n = t.name;
    if (n == "a.bf16") {
      sink.copy(view::contiguous(s->words<W>(storage::A), {8, 4}), src.transpose(0, 1));
    } else if (n == "b.f8") {
      sink.copy(view::contiguous(s->words<W>(storage::B), {17}), src);
    } else if (n == "c.f64") {
      sink.copy(view::contiguous(s->words<W>(storage::C1), {3, 5}), src);
      sink.copy(view::contiguous(s->words<W>(storage::C2), {3, 5}), src);
    } else if (n == "d.f32") {
      sink.copy(view::contiguous(s->words<W>(storage::D), {3, 4}), src.select(0, 1));
    } else if (n == "e.u8") {
      sink.skip(t);
    } else if (n == "f.i16") {
      // Tied weights loaded twice into one buffer: fine for overwrite, not for xor.
      const auto f = view::contiguous(s->words<W>(storage::F), {6});
      sink.copy(f, src);
      sink.copy(f, src);
    } else if (n == "g.f32") {
      sink.copy(view::contiguous(s->words<W>(storage::G), {0}), src);
    } else if (n == "h.u64") {
      sink.copy(view::contiguous(s->words<W>(storage::H), {2}), src.select(1, 1));
    } else if (n == "z.large") {
      sink.copy(view::contiguous(s->words<W>(storage::Z), {large_held_rows, large_cols}),
                src.slice(0, large_held_begin, large_held_rows));
    } else {
      sink.skip(t);
    }
  }
};

/// Where canonical element `index` of tensor `id` lands on this rank: up to two (buffer, word)
/// destinations, written as index arithmetic independent of the loader's views.
struct placement {
  int count = 0;
  std::size_t buffer[2]{};
  std::size_t word[2]{};
  void add(std::size_t b, std::uint64_t w) {
    buffer[count] = b;
    word[count] = static_cast<std::size_t>(w);
    ++count;
  }
};

inline placement placements(dcr::tensor_id id, std::uint64_t index) {
  placement p;
  switch (id) {
    case id_a: p.add(storage::A, (index % 8) * 4 + index / 8); break;  // [4,8] -> [8,4]
    case id_b: p.add(storage::B, index); break;
    case id_c: p.add(storage::C1, index); p.add(storage::C2, index); break;
    case id_d: if (index >= 12 && index < 24) p.add(storage::D, index - 12); break;
    case id_f: p.add(storage::F, index); break;  // twice to the same word: one destination
    case id_h: if (index % 2 == 1) p.add(storage::H, index / 2); break;
    case id_large: {
      const auto lo = static_cast<std::uint64_t>(large_held_begin * large_cols);
      const auto hi = static_cast<std::uint64_t>((large_held_begin + large_held_rows) * large_cols);
      if (index >= lo && index < hi) p.add(storage::Z, index - lo);
      break;
    }
    default: break;  // e (skipped), g (empty)
  }
  return p;
}

/// Whether the loader writes one destination word of tensor `id` more than once (so a
/// non-idempotent encoding must be refused for it).
constexpr bool writes_twice(dcr::tensor_id id) noexcept { return id == id_f; }

}  // namespace dcr_fuzz
