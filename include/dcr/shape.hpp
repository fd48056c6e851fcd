// dcr/shape.hpp: the one checked element count of a tensor shape.
//
// Every place that turns a shape into a count (the registry, contiguous views, DLPack views,
// mapping classes, safetensors and delta parsing) goes through checked_numel(), so a shape
// whose element count does not fit 64 bits is refused where it enters, never wrapped (signed
// overflow is undefined behaviour, and a wrapped count of 0 looks like an empty tensor).
#pragma once
#include "dcr/config.hpp"
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "dcr/error.hpp"

namespace dcr {

/// The element count of `shape`: the product of its extents (1 for a scalar; 0 when any extent
/// is 0, however large the others), or nullopt when an extent is negative or the count exceeds
/// `limit`. For a non-empty shape every partial product is then at most `limit` too.
[[nodiscard]] constexpr std::optional<std::int64_t> checked_numel(
    std::span<const std::int64_t> shape,
    std::int64_t limit = std::numeric_limits<std::int64_t>::max()) noexcept {
  bool empty = false;
  for (const std::int64_t e : shape) {
    if (e < 0) return std::nullopt;
    empty = empty || e == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (const std::int64_t e : shape) {
    if (n > limit / e) return std::nullopt;
    n *= e;
  }
  return n <= limit ? std::optional<std::int64_t>(n) : std::nullopt;
}

/// "[4096, 11008]": a shape as messages print it.
std::string shape_string(std::span<const std::int64_t> shape);

/// The element count of `shape` with elements of `word_bytes` bytes, such that the count and
/// the byte size both fit std::int64_t. Throws errc::invalid_argument for a negative extent and
/// errc::overflow for a larger count, the message starting with `what` and naming the shape.
std::int64_t expect_numel(std::span<const std::int64_t> shape, std::size_t word_bytes,
                                 const std::string& what);

}  // namespace dcr

#include "dcr/detail/shape.inl"
