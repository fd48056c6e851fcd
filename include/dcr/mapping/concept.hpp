// dcr/mapping/concept.hpp: the contract every mapping class meets.
//
// A mapping class describes how one source shard (a training rank's slice of one or more
// canonical tensors) lies in canonical coordinates. Like an mdspan layout mapping it is a small,
// trivially copyable value whose call operator turns an index into an offset: here a local flat
// (row-major) index of the shard into a `mapped_index` {part, canonical flat index}, where `part`
// selects one of the task's target canonical tensors (always 0 except for `stacked`).
//
// Laws every mapping obeys (tests/mapping checks them over every coordinate):
//   * defined for every local index in [0, local_size());
//   * injective: distinct local indices map to distinct (part, index);
//   * in range: index < part_size(part) and part < parts();
//   * the shards of one split together cover each canonical tensor exactly once;
//   * run_length(i) = r means m(i + k) = {m(i).part, m(i).index + k} for every k < r.
// `preserves_bits` says whether the projection copies stored words unchanged (true for every
// pure index mapping); only such tasks may carry xor or ulp records.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "dcr/config.hpp"

namespace dcr {

/// Opt-in tag: a mapping class declares `using mapping_concept = dcr::mapping_tag;`.
struct mapping_tag {};

/// Where a local element lands: target `part` of the task, flat canonical `index`.
struct mapped_index {
  std::uint32_t part;
  std::uint64_t index;
  friend constexpr bool operator==(const mapped_index&, const mapped_index&) = default;
};

template <class M>
concept index_mapping =
    std::is_trivially_copyable_v<M> && std::derived_from<typename M::mapping_concept, mapping_tag> &&
    requires(const M& m, std::uint64_t i, std::uint32_t p) {
      { m.local_size() } -> std::same_as<std::uint64_t>;
      { m.parts() } -> std::same_as<std::uint32_t>;
      { m.part_size(p) } -> std::same_as<std::uint64_t>;
      { m(i) } -> std::same_as<mapped_index>;
      { m.run_length(i) } -> std::same_as<std::uint64_t>;
      { M::preserves_bits() } -> std::same_as<bool>;
      { m.is_unique() } -> std::same_as<bool>;
      { m.is_exhaustive() } -> std::same_as<bool>;
    };

/// Balanced split of `n` items over `world` ranks: rank r gets [begin, end). The first
/// n % world ranks get one extra item, so the ranks cover [0, n) exactly once.
struct split_range {
  std::int64_t begin;
  std::int64_t end;
  DCR_HOST_DEVICE constexpr std::int64_t size() const noexcept { return end - begin; }
};
DCR_HOST_DEVICE constexpr split_range balanced_split(std::int64_t n, int world, int rank) noexcept {
  const std::int64_t base = n / world;
  const std::int64_t extra = n % world;
  const std::int64_t begin = rank * base + (rank < extra ? rank : extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace dcr
