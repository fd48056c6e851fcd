// dcr/canonical.hpp: canonical tensors (the Hugging Face checkpoint's names, dtypes and shapes)
// and the registry that gives each a stable id.
//
// Canonical coordinates are (tensor id, flat row-major index). Every payload addresses changes in
// canonical coordinates, so the trainer and every receiver must build the same registry. Ids are
// positions in name order, so they do not depend on the order tensors were declared in, and the
// registry's fingerprint (a hash of every name, dtype and shape) travels in each payload so a
// receiver built for another model refuses it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/shape.hpp"

namespace dcr {

/// Identifies a canonical tensor within one registry.
using tensor_id = std::uint32_t;

/// One tensor of the canonical checkpoint.
struct canonical_tensor {
  std::string name;
  dtype type = dtype::bf16;
  std::vector<std::int64_t> shape;

  /// Number of elements (exact for every tensor a tensor_registry accepts).
  [[nodiscard]] std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  /// Size in bytes.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    return numel() * static_cast<std::int64_t>(dtype_size(type));
  }
};

/// A canonical coordinate: a tensor and a flat row-major index into it.
struct canonical_coord {
  tensor_id tensor;
  std::uint64_t index;
  friend constexpr bool operator==(const canonical_coord&, const canonical_coord&) = default;
};

namespace detail {
/// 64-bit FNV-1a, used for stable name hashes (ownership, fingerprints). Not cryptographic.
constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}
constexpr std::uint64_t fnv1a64_u64(std::uint64_t v, std::uint64_t h) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}
}  // namespace detail

/// Stable hash of a name, the same on every machine and build.
constexpr std::uint64_t stable_name_hash(std::string_view name) { return detail::fnv1a64(name); }

/// The set of canonical tensors of one model, with stable ids (positions in name order).
class tensor_registry {
 public:
  tensor_registry() = default;

  /// Builds the registry; names must be unique and non-empty (errc::invalid_argument), extents
  /// non-negative (errc::invalid_argument), and each tensor's element count and byte size, and
  /// the bytes of all tensors together, must fit std::int64_t (errc::overflow naming the tensor
  /// and its shape).
  explicit tensor_registry(std::vector<canonical_tensor> tensors);

  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] std::span<const canonical_tensor> tensors() const noexcept { return tensors_; }

  /// The tensor with id `id`; throws unknown_tensor if out of range.
  [[nodiscard]] const canonical_tensor& at(tensor_id id) const;
  /// The id of `name`, or nullopt.
  [[nodiscard]] std::optional<tensor_id> find(std::string_view name) const;
  /// The id of `name`; throws unknown_tensor if absent.
  [[nodiscard]] tensor_id id(std::string_view name) const;
  /// Hash of every name, dtype and shape; equal registries have equal fingerprints.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }
  /// Total bytes of all tensors (a full checkpoint).
  [[nodiscard]] std::int64_t total_bytes() const noexcept;
  /// Largest tensor in bytes (sizes the receiver's scratch).
  [[nodiscard]] std::int64_t max_tensor_bytes() const noexcept;

 private:
  std::vector<canonical_tensor> tensors_;
  std::unordered_map<std::string, tensor_id> by_name_;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace dcr

#include "dcr/detail/canonical.inl"
