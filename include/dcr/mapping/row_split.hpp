// dcr/mapping/row_split.hpp: the shard holds a contiguous range of rows (dimension 0) of the
// canonical tensor: a split of the outermost
// dimension (column-parallel linear weights, vocab-parallel embeddings, expert ranges).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dcr/mapping/box.hpp"

namespace dcr {

class row_split {
 public:
  using mapping_concept = mapping_tag;

  constexpr row_split() noexcept = default;

  /// Rank `rank` of `world` holds balanced_split(shape[0], world, rank) rows of `shape`.
  row_split(std::span<const std::int64_t> canonical_shape, int world, int rank) {
    DCR_EXPECTS(!canonical_shape.empty(), errc::invalid_argument, "row_split: scalar tensor");
    DCR_EXPECTS(world >= 1 && rank >= 0 && rank < world, errc::invalid_argument,
                "row_split: rank outside [0, world)");
    (void)expect_numel(canonical_shape, 1, "row_split");
    const std::int64_t row_elems = expect_numel(canonical_shape.subspan(1), 1, "row_split: one row");
    const auto rows = balanced_split(canonical_shape[0], world, rank);
    offset_ = static_cast<std::uint64_t>(rows.begin * row_elems);
    size_ = static_cast<std::uint64_t>(rows.size() * row_elems);
    canonical_size_ = static_cast<std::uint64_t>(canonical_shape[0] * row_elems);
    first_row_ = rows.begin;
    rows_ = rows.size();
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
  [[nodiscard]] constexpr std::int64_t first_row() const noexcept { return first_row_; }
  [[nodiscard]] constexpr std::int64_t rows() const noexcept { return rows_; }

  DCR_HOST_DEVICE constexpr mapped_index operator()(std::uint64_t i) const noexcept {
    return {0, offset_ + i};
  }

  /// How many local indices from i on map to consecutive canonical indices of one part (>= 1
  /// for i < local_size()): lets copies and projections move whole runs at once.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t run_length(std::uint64_t i) const noexcept {
    return size_ - i;
  }

  /// The same mapping as a box over `canonical_shape`.
  [[nodiscard]] box to_box(std::span<const std::int64_t> canonical_shape) const {
    std::vector<std::int64_t> off(canonical_shape.size(), 0);
    std::vector<std::int64_t> ext(canonical_shape.begin(), canonical_shape.end());
    off[0] = first_row_;
    ext[0] = rows_;
    return box(canonical_shape, off, ext);
  }

 private:
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t canonical_size_ = 0;
  std::int64_t first_row_ = 0;
  std::int64_t rows_ = 0;
};

static_assert(index_mapping<row_split>);

}  // namespace dcr
