// tests/packaging/consumer/consumer.hpp: what every consumer program of the packaging tests runs
// (a project outside dcr, built against the installed headers or dcr as a subproject): change
// detection over a tensor view, one payload encoded and decoded back bit for bit, and the version
// macros. Returns 0 when all of it holds, 1 (with a message on stderr) otherwise.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dcr/dcr.hpp"
#include "dcr/version.hpp"

#if defined(DCR_CONSUMER_EXPECT_CXX23) && __cplusplus <= 202002L
#error "the consumer asked for C++23 but compiles as C++20 or older: something forced -std"
#endif

inline int run_consumer(const char* who) {
  constexpr std::int64_t rows = 8, cols = 16;
  const dcr::tensor_registry registry({{"w", dcr::dtype::bf16, {rows, cols}}});

  std::vector<std::uint16_t> old_words(rows * cols), new_words(rows * cols);
  for (std::size_t i = 0; i < old_words.size(); ++i)
    old_words[i] = dcr::float_to_bf16(0.25f * static_cast<float>(i));
  new_words = old_words;
  for (std::size_t i : {3u, 17u, 18u, 127u}) new_words[i] ^= 0x0101;

  // The changed elements below row 0, found through a view of rows 1.. of the tensor (its
  // words are contiguous), as canonical flat indices (first_index: where the view starts).
  using view = dcr::tensor_view<const std::uint16_t>;
  const auto whole_old = view::contiguous(old_words.data(), {rows, cols});
  const auto whole_new = view::contiguous(new_words.data(), {rows, cols});
  const auto tail_old = whole_old.slice(0, 1, rows - 1), tail_new = whole_new.slice(0, 1, rows - 1);
  std::vector<std::uint64_t> changed;
  dcr::detect_changes<std::uint16_t>(std::span(tail_old.data(), tail_old.size()),
                                     std::span(tail_new.data(), tail_new.size()), changed, cols);

  dcr::item it;
  it.tensor = registry.id("w");
  it.type = dcr::dtype::bf16;
  it.enc = dcr::encoding::overwrite;
  it.indices = changed;
  for (auto i : changed) {
    std::byte b[2];
    std::memcpy(b, &new_words[i], 2);
    it.values.insert(it.values.end(), b, b + 2);
  }
  dcr::payload_header header;
  header.id = {0, 1, 0, 0, 0};
  header.registry_fingerprint = registry.fingerprint();
  std::vector<std::byte> payload;
  dcr::payload_encoder().encode(header, std::span(&it, 1), registry, payload);
  std::vector<dcr::item> decoded;
  dcr::payload_decoder().decode(payload, registry, decoded);

  const bool ok = changed == std::vector<std::uint64_t>{17, 18, 127} && decoded.size() == 1 &&
                  decoded[0].indices == it.indices && decoded[0].values == it.values;
  std::printf("%s: dcr %s, %zu changes, %zu payload bytes, %s\n", who, DCR_VERSION_STRING,
              changed.size(), payload.size(), ok ? "round trip bit-exact" : "MISMATCH");
  if (!ok) std::fprintf(stderr, "%s: the decoded payload differs from what was encoded\n", who);
  return ok ? 0 : 1;
}
