// dcr/mapping/stacked.hpp: a stacked source [E, ...] whose slice e is canonical tensor e of the
// task's targets (routed experts stored stacked in training, per-expert in the checkpoint).
// Each expert slice may itself be a box of its canonical tensor (experts split by TP as well).
// The reverse direction (per-expert source, stacked canonical) is a plain box with an offset
// on dimension 0: see `stacked::expert_of_stack`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dcr/mapping/box.hpp"

namespace dcr {

class stacked {
 public:
  using mapping_concept = mapping_tag;

  constexpr stacked() noexcept = default;

  /// `experts` consecutive slices, slice e mapping through `inner` into target part e.
  stacked(std::uint32_t experts, const box& inner) : experts_(experts), inner_(inner) {
    DCR_EXPECTS(experts >= 1, errc::invalid_argument, "stacked: no experts");
    slice_size_ = inner.local_size();
  }

  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t local_size() const noexcept {
    return slice_size_ * experts_;
  }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint32_t parts() const noexcept { return experts_; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t part_size(std::uint32_t p) const noexcept {
    return inner_.part_size(p);
  }
  [[nodiscard]] DCR_HOST_DEVICE static constexpr bool preserves_bits() noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_unique() const noexcept { return true; }
  [[nodiscard]] DCR_HOST_DEVICE constexpr bool is_exhaustive() const noexcept {
    return inner_.is_exhaustive();
  }
  [[nodiscard]] DCR_HOST_DEVICE constexpr const box& inner() const noexcept { return inner_; }

  /// How many local indices from i on map to consecutive canonical indices of one part (>= 1
  /// for i < local_size()): lets copies and projections move whole runs at once.
  [[nodiscard]] DCR_HOST_DEVICE constexpr std::uint64_t run_length(std::uint64_t i) const noexcept {
    const std::uint64_t within = i % slice_size_;
    const std::uint64_t run = inner_.run_length(within);
    return run < slice_size_ - within ? run : slice_size_ - within;
  }

  DCR_HOST_DEVICE constexpr mapped_index operator()(std::uint64_t i) const noexcept {
    const auto e = static_cast<std::uint32_t>(i / slice_size_);
    return {e, inner_(i - static_cast<std::uint64_t>(e) * slice_size_).index};
  }

  /// The reverse case: a per-expert source that is slice `e` of a stacked canonical tensor of
  /// shape `stack_shape` = [E, ...].
  static box expert_of_stack(std::span<const std::int64_t> stack_shape, std::int64_t e) {
    DCR_EXPECTS(!stack_shape.empty() && e >= 0 && e < stack_shape[0], errc::out_of_range,
                "stacked::expert_of_stack: expert outside the stack");
    std::vector<std::int64_t> off(stack_shape.size(), 0);
    std::vector<std::int64_t> ext(stack_shape.begin(), stack_shape.end());
    off[0] = e;
    ext[0] = 1;
    return box(stack_shape, off, ext);
  }

 private:
  std::uint32_t experts_ = 0;
  std::uint64_t slice_size_ = 0;
  box inner_{};
};

static_assert(index_mapping<stacked>);

}  // namespace dcr
