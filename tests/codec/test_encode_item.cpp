// encode_gathered_item (codec/encode_item.hpp): the item it leaves is the item of the encoding
// choose_encoding picks, built from the same gathered words (make_item), for every policy,
// permission and word width; bad arguments are refused with the item left as it was.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "dcr/codec/choose.hpp"
#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/error.hpp"

namespace {

using dcr::dtype;
using dcr::encoding;
using dcr::encoding_policy;

template <class W>
struct gathered {
  std::vector<std::uint64_t> indices;
  std::vector<W> old_words, new_words;
};

// `count` changes with small relative moves (so ulp or xor wins under mixed) or unrelated new
// words (so overwrite can win), at strictly increasing indices.
template <class W>
gathered<W> make_changes(std::size_t count, bool small_moves, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  gathered<W> g;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    at += 1 + rng() % 7;
    g.indices.push_back(at);
    const W old = static_cast<W>(rng());
    const W step = static_cast<W>(1 + rng() % 3);
    g.old_words.push_back(old);
    g.new_words.push_back(small_moves ? static_cast<W>(old + step) : static_cast<W>(rng()));
  }
  return g;
}

template <class W>
dcr::item gathered_item(const gathered<W>& g, dtype type) {
  dcr::item it;
  it.tensor = 3;
  it.type = type;
  it.indices = g.indices;
  it.values.resize(g.old_words.size() * sizeof(W));
  if (!g.old_words.empty()) std::memcpy(it.values.data(), g.old_words.data(), it.values.size());
  return it;
}

template <class W>
void check_matches_choose_and_make_item(dtype type) {
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5000}})
    for (const bool small : {true, false})
      for (const auto policy : {encoding_policy::mixed, encoding_policy::overwrite_only,
                                encoding_policy::xor_only, encoding_policy::ulp_only})
        for (const bool permitted : {true, false}) {
          CAPTURE(count);
          CAPTURE(small);
          CAPTURE(static_cast<int>(policy));
          CAPTURE(permitted);
          const auto g = make_changes<W>(count, small, static_cast<std::uint32_t>(count + small));
          const encoding expected_enc =
              dcr::choose_encoding<W>(policy, permitted, g.old_words, g.new_words);
          const dcr::item expected = dcr::make_item<W>(3, type, expected_enc, g.indices,
                                                       g.old_words, g.new_words);
          dcr::item it = gathered_item(g, type);
          CHECK(dcr::encode_gathered_item<W>(it, g.new_words, policy, permitted) == expected_enc);
          CHECK(it.enc == expected.enc);
          CHECK(it.tensor == expected.tensor);
          CHECK(it.type == expected.type);
          CHECK(it.indices == expected.indices);
          CHECK(it.values == expected.values);
        }
}

}  // namespace

TEST_CASE("encode_gathered_item equals make_item of choose_encoding's pick") {
  check_matches_choose_and_make_item<std::uint8_t>(dtype::f8_e4m3);
  check_matches_choose_and_make_item<std::uint16_t>(dtype::bf16);
  check_matches_choose_and_make_item<std::uint32_t>(dtype::f32);
  check_matches_choose_and_make_item<std::uint64_t>(dtype::f64);
}

TEST_CASE("encode_gathered_item: mixed picks a delta for small moves, values in place") {
  const auto g = make_changes<std::uint16_t>(4000, true, 11);
  dcr::item it = gathered_item(g, dtype::bf16);
  const encoding e =
      dcr::encode_gathered_item<std::uint16_t>(it, g.new_words, encoding_policy::mixed, true);
  REQUIRE(e != encoding::overwrite);
  const auto values = it.words<std::uint16_t>();
  dcr::visit_encoding(e, [&](auto enc) {
    using E = decltype(enc);
    for (std::size_t i = 0; i < values.size(); ++i)
      CHECK(E::apply(g.old_words[i], values[i]) == g.new_words[i]);
  });
}

TEST_CASE("encode_gathered_item refuses a wrong width or lengths and leaves the item alone") {
  const auto g = make_changes<std::uint16_t>(10, true, 5);
  const dcr::item before = gathered_item(g, dtype::bf16);

  dcr::item wrong_type = before;
  wrong_type.type = dtype::f32;
  CHECK_THROWS_WITH_AS(dcr::encode_gathered_item<std::uint16_t>(wrong_type, g.new_words,
                                                               encoding_policy::mixed, true),
                       doctest::Contains("word of 2 bytes for dtype"), dcr::error);
  CHECK(wrong_type.values == before.values);

  dcr::item it = before;
  const std::span<const std::uint16_t> short_new(g.new_words.data(), 9);
  try {
    (void)dcr::encode_gathered_item<std::uint16_t>(it, short_new, encoding_policy::mixed, true);
    FAIL("no error for 9 new words");
  } catch (const dcr::error& e) {
    CHECK(e.code() == dcr::errc::invalid_argument);
    CHECK(std::string(e.what()).find("10 indices but 10 old and 9 new words") !=
          std::string::npos);
  }
  CHECK(it.values == before.values);
  CHECK(it.enc == before.enc);

  dcr::item short_old = before;
  short_old.values.resize(9 * 2);
  CHECK_THROWS_AS(dcr::encode_gathered_item<std::uint16_t>(short_old, g.new_words,
                                                          encoding_policy::mixed, true),
                  dcr::error);
}
