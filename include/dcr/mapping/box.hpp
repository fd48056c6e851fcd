// dcr/mapping/box.hpp: the general N-d mapping: a box of a canonical tensor, optionally seen
// with its axes permuted. Every other mapping class is a case of it (see to_box()).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "dcr/error.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/shape.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// The source shard is the box [offsets, offsets + extents) of a canonical tensor of shape
/// `canonical_shape`; local axis k walks canonical axis `axes[k]` (identity = no permutation).
/// Local elements are numbered row-major over the local shape extents[axes[0..rank)].
class box {
 public:
  using mapping_concept = mapping_tag;

  constexpr box() noexcept = default;

  /// Validates the box against the canonical shape; axes empty means identity.
  box(std::span<const std::int64_t> canonical_shape, std::span<const std::int64_t> offsets,
      std::span<const std::int64_t> extents, std::span<const int> axes = {}) {
    const auto r = canonical_shape.size();
    DCR_EXPECTS(r <= static_cast<std::size_t>(max_rank), errc::invalid_argument,
                "box: rank exceeds dcr::max_rank");
    DCR_EXPECTS(offsets.size() == r && extents.size() == r && (axes.empty() || axes.size() == r),
                errc::invalid_argument, "box: offsets/extents/axes rank differs from the shape");
    canonical_size_ = static_cast<std::uint64_t>(expect_numel(canonical_shape, 1, "box"));
    rank_ = static_cast<int>(r);
    std::array<bool, max_rank> used{};
    index_array canonical_strides{};
    std::uint64_t stride = 1;  // unsigned: an empty tensor's strides may wrap, addressing nothing
    for (int d = rank_ - 1; d >= 0; --d) {
      canonical_strides[d] = static_cast<std::int64_t>(stride);
      stride *= static_cast<std::uint64_t>(canonical_shape[d]);
    }
    base_ = 0;
    local_size_ = 1;
    exhaustive_ = true;
    for (int d = 0; d < rank_; ++d) {
      DCR_EXPECTS(offsets[d] >= 0 && extents[d] >= 0 &&
                      offsets[d] + extents[d] <= canonical_shape[d],
                  errc::out_of_range, "box: box extends past the canonical tensor");
      base_ += static_cast<std::uint64_t>(offsets[d]) * static_cast<std::uint64_t>(canonical_strides[d]);
      local_size_ *= static_cast<std::uint64_t>(extents[d]);
      if (extents[d] != canonical_shape[d]) exhaustive_ = false;
    }
    for (int k = 0; k < rank_; ++k) {
      const int a = axes.empty() ? k : axes[k];
      DCR_EXPECTS(a >= 0 && a < rank_ && !used[a], errc::invalid_argument,
                  "box: axes is not a permutation");
      used[a] = true;
      local_extents_[k] = extents[a];
      step_[k] = canonical_strides[a];
    }
  }

  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t local_size() const noexcept {
    return local_size_;
  }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint32_t parts() const noexcept { return 1; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t part_size(std::uint32_t) const noexcept {
    return canonical_size_;
  }
  [[nodiscard]] DCR_HOST_DEVICE static constexpr bool preserves_bits() noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_unique() const noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_exhaustive() const noexcept {
    return exhaustive_;
  }
  [[nodiscard]] DCR_HOST_DEVICE constexpr int rank() const noexcept { return rank_; }
  /// Extent of local axis k.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::int64_t local_extent(int k) const noexcept {
    return local_extents_[k];
  }

  /// How many local indices from i on map to consecutive canonical indices of one part (>= 1
  /// for i < local_size()): lets copies and projections move whole runs at once.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t run_length(std::uint64_t i) const noexcept {
    if (rank_ == 0) return local_size_ - i;
    // Trailing local axes that walk the canonical tensor densely form one run.
    std::uint64_t span = 1;
    int k = rank_ - 1;
    for (; k >= 0 && step_[k] == static_cast<std::int64_t>(span); --k)
      span *= static_cast<std::uint64_t>(local_extents_[k]);
    if (span == 1) return 1;
    return span - i % span;
  }

  DCR_HOST_DEVICE constexpr mapped_index operator()(std::uint64_t i) const noexcept {
    std::uint64_t index = base_;
    for (int k = rank_ - 1; k >= 0; --k) {
      const auto e = static_cast<std::uint64_t>(local_extents_[k]);
      index += (i % e) * static_cast<std::uint64_t>(step_[k]);
      i /= e;
    }
    return {0, index};
  }

 private:
  int rank_ = 0;
  bool exhaustive_ = true;
  std::uint64_t base_ = 0;
  std::uint64_t local_size_ = 0;
  std::uint64_t canonical_size_ = 0;
  index_array local_extents_{};
  index_array step_{};  // canonical stride walked by each local axis
};

static_assert(index_mapping<box>);

}  // namespace dcr
