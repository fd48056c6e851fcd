// dcr/mapping/column_split.hpp: the shard holds a contiguous range of columns (the last
// dimension) of the canonical tensor: row-parallel linear weights (o_proj, down_proj).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dcr/mapping/box.hpp"

namespace dcr {

class column_split {
 public:
  using mapping_concept = mapping_tag;

  constexpr column_split() noexcept = default;

  /// Rank `rank` of `world` holds balanced_split(shape[last], world, rank) columns.
  column_split(std::span<const std::int64_t> canonical_shape, int world, int rank) {
    DCR_EXPECTS(!canonical_shape.empty(), errc::invalid_argument, "column_split: scalar tensor");
    DCR_EXPECTS(world >= 1 && rank >= 0 && rank < world, errc::invalid_argument,
                "column_split: rank outside [0, world)");
    (void)expect_numel(canonical_shape, 1, "column_split");
    const std::int64_t outer =
        expect_numel(canonical_shape.first(canonical_shape.size() - 1), 1, "column_split: one column");
    const std::int64_t cols = canonical_shape.back();
    const auto mine = balanced_split(cols, world, rank);
    columns_ = static_cast<std::uint64_t>(cols);
    local_columns_ = static_cast<std::uint64_t>(mine.size());
    first_column_ = static_cast<std::uint64_t>(mine.begin);
    size_ = static_cast<std::uint64_t>(outer) * local_columns_;
    canonical_size_ = static_cast<std::uint64_t>(outer) * columns_;
  }

  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t local_size() const noexcept { return size_; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint32_t parts() const noexcept { return 1; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t part_size(std::uint32_t) const noexcept {
    return canonical_size_;
  }
  [[nodiscard]] DCR_HOST_DEVICE static constexpr bool preserves_bits() noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_unique() const noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_exhaustive() const noexcept {
    return size_ == canonical_size_;
  }
  [[nodiscard]] constexpr std::uint64_t first_column() const noexcept { return first_column_; }
  [[nodiscard]] constexpr std::uint64_t local_columns() const noexcept { return local_columns_; }

  DCR_HOST_DEVICE constexpr mapped_index operator()(std::uint64_t i) const noexcept {
    const std::uint64_t row = i / local_columns_;
    const std::uint64_t col = i - row * local_columns_;
    return {0, row * columns_ + first_column_ + col};
  }

  /// How many local indices from i on map to consecutive canonical indices of one part (>= 1
  /// for i < local_size()): lets copies and projections move whole runs at once.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t run_length(std::uint64_t i) const noexcept {
    return local_columns_ - i % local_columns_;
  }

  /// The same mapping as a box over `canonical_shape`.
  [[nodiscard]] box to_box(std::span<const std::int64_t> canonical_shape) const {
    std::vector<std::int64_t> off(canonical_shape.size(), 0);
    std::vector<std::int64_t> ext(canonical_shape.begin(), canonical_shape.end());
    off.back() = static_cast<std::int64_t>(first_column_);
    ext.back() = static_cast<std::int64_t>(local_columns_);
    return box(canonical_shape, off, ext);
  }

 private:
  std::uint64_t columns_ = 1;
  std::uint64_t local_columns_ = 1;
  std::uint64_t first_column_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t canonical_size_ = 0;
};

static_assert(index_mapping<column_split>);

}  // namespace dcr
