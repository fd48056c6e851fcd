// dcr/mapping/replicated.hpp: the shard is the whole canonical tensor (norms, routers, any
// tensor every rank holds in full). Only the owner replica projects it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dcr/mapping/box.hpp"

namespace dcr {

class replicated {
 public:
  using mapping_concept = mapping_tag;

  constexpr replicated() noexcept = default;
  /// A replicated shard of a canonical tensor with `numel` elements.
  explicit constexpr replicated(std::uint64_t numel) noexcept : size_(numel) {}

  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t local_size() const noexcept { return size_; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint32_t parts() const noexcept { return 1; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t part_size(std::uint32_t) const noexcept {
    return size_;
  }
  [[nodiscard]] DCR_HOST_DEVICE static constexpr bool preserves_bits() noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_unique() const noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_exhaustive() const noexcept { return true; }

  DCR_HOST_DEVICE constexpr mapped_index operator()(std::uint64_t i) const noexcept {
    return {0, i};
  }

  /// How many local indices from i on map to consecutive canonical indices of one part (>= 1
  /// for i < local_size()): lets copies and projections move whole runs at once.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t run_length(std::uint64_t i) const noexcept {
    return size_ - i;
  }

  /// The same mapping as a box over `canonical_shape`.
  [[nodiscard]] box to_box(std::span<const std::int64_t> canonical_shape) const {
    std::vector<std::int64_t> zeros(canonical_shape.size(), 0);
    return box(canonical_shape, zeros, canonical_shape);
  }

 private:
  std::uint64_t size_ = 0;
};

static_assert(index_mapping<replicated>);

}  // namespace dcr
