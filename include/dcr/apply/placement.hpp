// dcr/apply/placement.hpp: the compiled placement of a receiver: where its engine's loader puts
// every canonical element, recorded once at prewarm so that applying an item touches only the
// changed elements, without calling the loader.
//
// How it is compiled. compile_placement() runs the loader once per canonical tensor (twice, to
// check that it is deterministic) with a probing sink over a zeroed scratch view of the tensor.
// As in the general path (dcr/apply/sink.hpp), a scratch element's offset from the scratch base
// is its canonical flat index, so every copy(dst, src[, transform]) the loader issues is
// recorded by address, with no value involved: the exact inverse of the src view (canonical
// index -> storage offset, view_inverse), the destination base pointer and word width, and the
// element transform. Consecutive copies that step through the tensor by a constant canonical
// and storage stride (lm_head copied one row at a time, experts one slice at a time) are merged
// into one record with an extra outer dimension, so the per-item cost does not grow with the
// number of copies. Skips are recorded too.
//
// What is checked at compile time (errc::unsupported_loader_path, message naming the tensor):
//   * every copy's src is a non-overlapping strided view inside the tensor the loader was given
//     (a copy from a temporary, a broadcast, a view of another buffer are rejected);
//   * every tensor is copied or explicitly skipped, never both;
//   * a transform reads the tensor's dtype and writes the destination's word width
//     (errc::dtype_mismatch);
//   * the loader does not modify its src (the scratch is still zero after each load);
//   * two loads of the same tensor issue the same copies (determinism);
//   * no destination element receives two different canonical elements. Writes are compared
//     byte-exactly across all tensors (copies grouped by overlapping address windows, then a
//     bitmap of the written bytes of each group, over the group's window when the writes fill
//     it, else over only the 64-unit blocks they touch: memory follows the elements placed, not
//     the address span, when one tensor's parts lie in allocations far apart). Two writes of
//     the same canonical element (same tensor, same index, same transform) into the same
//     destination element are allowed and make the tensor overwrite-only (an xor applied twice
//     would cancel). The same destination element written by element i of two *different*
//     tensors of the same dtype with the same transform is allowed only as a tie the loader
//     declares (tied_tensors(), dcr/apply/loader.hpp: an engine sharing one storage for
//     model.embed_tokens.weight and lm_head.weight and loading both): both tensors become
//     overwrite-only, and exactness relies on the checkpoint keeping them bit-equal, as tied
//     weights are. Anything else (an undeclared tie, two different indices, partially
//     overlapping words) is an error naming both tensors and the overlapping destination byte
//     range: no delta can reproduce a dense load's "last write wins".
// A tensor is overwrite-only (xor/ulp records refused) when any of its non-empty copies has a
// transform other than the identity, or it takes part in a repeated write or a tie; the plan
// reports why. An empty copy (a rank whose share of the tensor is empty, e.g. 4 rows over 5
// ranks, whose loader still issues the zero-element copy) places no element and records no
// placement: it is checked like any copy (shapes, transform dtypes, copy after skip) but sets no
// bit-preservation condition, so it never makes a tensor overwrite-only. The general path's
// delta_sink follows the same rule, so both paths accept and refuse the same items.
//
// Records are trivially copyable and hold raw storage pointers: a plan is valid while the
// engine's storage stays where it was at prewarm (prewarm again after the engine reallocates or
// changes its placement).
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/apply/record.hpp"
#include "dcr/apply/sink.hpp"
#include "dcr/apply/transform.hpp"
#include "dcr/canonical.hpp"
#include "dcr/config.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// Which apply path an item_applier / receiver uses.
enum class apply_path : std::uint8_t {
  compiled = 0,  ///< ours (default): placement records from prewarm, no loader call per item
  general = 1,   ///< the paper's: run the loader per item with an intercepting delta_sink
};

/// The placement report of one canonical tensor on this rank.
struct tensor_placement {
  tensor_id tensor = 0;
  std::string_view name;          ///< lives in the registry
  bool skipped = false;           ///< the loader skips the tensor on this rank
  std::uint64_t copies = 0;       ///< loader copies per load (empty ones included)
  std::uint64_t placements = 0;   ///< compiled records after merging runs of copies
  std::uint64_t elements = 0;     ///< destination elements one dense load writes
  bool overwrite_only = false;    ///< xor/ulp records for it are refused
  std::string reason;             ///< why it is overwrite-only ("" otherwise)
  std::uint32_t first_placement = 0;  ///< its records: placements()[first, first + placements)
};
namespace detail {
class placement_compiler;
/// Merges runs of consecutive records (same geometry, width and transform) whose canonical
/// first index and storage base advance by constant steps, with the step beyond the record's
/// span, into one record with an extra outermost dimension. Returns the new end of [begin, end).
std::size_t merge_runs(std::vector<placement>& ps, std::size_t begin, std::size_t end);
/// An address as the refusals print it: "0x7f12345000".
std::string hex_address(std::uintptr_t a);
}  // namespace detail

/// The compiled placement of every canonical tensor on one rank (see the file comment).
class placement_plan {
 public:
  /// Every record, grouped by tensor id (each tensor's records in the loader's copy order).
  [[nodiscard]] std::span<const placement> placements() const noexcept { return placements_; }

  /// The records of tensor `id`.
  [[nodiscard]] std::span<const placement> placements_of(tensor_id id) const;

  /// The report of tensor `id`; throws errc::unknown_tensor for an id outside the registry.
  [[nodiscard]] const tensor_placement& at(tensor_id id) const;

  /// The report of every tensor, by id.
  [[nodiscard]] std::span<const tensor_placement> report() const noexcept { return tensors_; }

  /// Ids of the overwrite-only tensors, ascending.
  [[nodiscard]] std::span<const tensor_id> overwrite_only_tensors() const noexcept {
    return overwrite_only_;
  }

  [[nodiscard]] bool skips(tensor_id id) const { return at(id).skipped; }
  [[nodiscard]] bool overwrite_only(tensor_id id) const { return at(id).overwrite_only; }
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }

 private:
  friend class detail::placement_compiler;

  std::vector<placement> placements_;
  std::vector<tensor_placement> tensors_;
  std::vector<tensor_id> overwrite_only_;
};

/// Compiles the placement of `loader` for every tensor of `registry` (see the file comment).
/// `scratch` must hold at least registry.max_tensor_bytes() zero bytes, 8-byte aligned; it is
/// only read through views (and checked to be still zero after each load). Throws
/// errc::unsupported_loader_path or errc::dtype_mismatch naming the tensor for a loader that
/// breaks a condition. Cost: two loader calls per tensor, plus a pass over the destination
/// elements of copies whose address windows intersect.
template <class Loader>
  requires loader<Loader>
placement_plan compile_placement(const tensor_registry& registry, Loader& loader,
                                 std::byte* scratch, std::size_t scratch_bytes);

}  // namespace dcr

#include "dcr/detail/apply/placement.inl"
