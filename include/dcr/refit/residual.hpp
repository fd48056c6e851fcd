// dcr/refit/residual.hpp: residual conversion tasks, the owner-side description of canonical
// tensors that must be built before they can be compared.
//
// An affine task maps every source element to one canonical element through a fixed index
// mapping, so its changes can be projected without building anything. Everything else is a
// residual task: fused q/k/v blocks split per KV group, stacked experts, tied weights (one shard,
// two canonical tensors), padding that the checkpoint drops, or values scaled by a shared factor
// and cast (a change of the factor alone changes every value it scales). A residual task names
// its inputs (source shards), its outputs (canonical tensors) and, per output, which inputs the
// output depends on, and supplies the conversion as a callable that builds one output from the
// inputs.
//
// Per transition the owner of the task (see dcr::owner):
//   1. sets a change flag per input: an input changed iff any stored word of the candidate
//      differs from the committed copy (exact compare, dcr::detect_changes; no hashes);
//   2. rebuilds only the outputs that depend on a changed input, into scratch;
//   3. compares each rebuilt output bitwise with its residual baseline (the committed canonical
//      tensor) and emits the differing elements as overwrite records;
//   4. after the joint commit, writes the changed words into the input copies and the baseline,
//      in place.
// Residual records are always overwrites: the conversion may combine several source values
// (scale * value, cast), so a source-side xor mask says nothing about the canonical change.
//
// Contract of the conversion callable (checked where it can be, documented where it cannot):
//   * convert(output, inputs, destination) writes every byte of `destination`, the canonical
//     tensor outputs[output].tensor in row-major order with the registry's dtype and size;
//   * it reads only the inputs outputs[output].depends_on lists (all inputs when the list is
//     empty): a change to an undeclared input would not select the output, and its receivers
//     would silently keep stale bits;
//   * it is deterministic: the same input bits give the same output bits on every call (a
//     retry rebuilds the same records; a non-deterministic conversion yields spurious changes);
//   * it may throw; the owner then propagates the exception and nothing committed changes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/refit/task.hpp"

namespace dcr {

/// One source shard a residual task reads.
struct residual_input {
  std::string name;          ///< the source shard's name (diagnostics), unique within the task
  dtype type = dtype::bf16;  ///< element type; change detection compares words of this width
  std::uint64_t elements = 0;

  /// Bytes the shard must have.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return elements * dtype_size(type); }
};

/// One canonical tensor a residual task builds.
struct residual_output {
  tensor_id tensor = 0;
  /// Indices into residual_task::inputs the output depends on; empty means every input.
  std::vector<std::uint32_t> depends_on;
};

/// Builds output `output` (an index into residual_task::outputs) from the candidate bytes of
/// every input (inputs[k] for residual_task::inputs[k]) into `destination`, the whole canonical
/// tensor in row-major order. See the file comment for the contract.
using residual_conversion =
    std::function<void(std::size_t output, std::span<const std::span<const std::byte>> inputs,
                       std::span<std::byte> destination)>;

/// A conversion from one or more source shards to one or more canonical tensors.
struct residual_task {
  std::string name;  ///< unique across the model; residual ownership hashes it
  std::vector<residual_input> inputs;
  std::vector<residual_output> outputs;
  residual_conversion convert;

  /// Whether output `o` depends on input `k`.
  [[nodiscard]] bool depends(std::size_t o, std::size_t k) const {
    const auto& d = outputs[o].depends_on;
    return d.empty() || std::find(d.begin(), d.end(), static_cast<std::uint32_t>(k)) != d.end();
  }
  /// Bytes of every input (what the owner compares and keeps a committed copy of).
  [[nodiscard]] std::uint64_t input_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& in : inputs) b += in.bytes();
    return b;
  }
};

/// Typed view of a shard's bytes as words W (for conversions). Throws invalid_argument when the
/// byte count is not a multiple of sizeof(W) or the data is not aligned for W.
template <storage_word W>
[[nodiscard]] std::span<const W> words_of(std::span<const std::byte> bytes) {
  DCR_EXPECTS(bytes.size() % sizeof(W) == 0 &&
                  reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(W) == 0,
              errc::invalid_argument,
              "words_of: " + std::to_string(bytes.size()) + " bytes are not aligned " +
                  std::to_string(sizeof(W)) + "-byte words");
  return {reinterpret_cast<const W*>(bytes.data()), bytes.size() / sizeof(W)};
}
template <storage_word W>
[[nodiscard]] std::span<W> words_of(std::span<std::byte> bytes) {
  DCR_EXPECTS(bytes.size() % sizeof(W) == 0 &&
                  reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(W) == 0,
              errc::invalid_argument,
              "words_of: " + std::to_string(bytes.size()) + " bytes are not aligned " +
                  std::to_string(sizeof(W)) + "-byte words");
  return {reinterpret_cast<W*>(bytes.data()), bytes.size() / sizeof(W)};
}

/// Checks one residual task against the registry: a name, a conversion, at least one input
/// (uniquely named, non-empty) and one output, every output a known tensor named once, every
/// dependency a valid input index. Throws dcr::error naming the task.
void validate_residual_task(const residual_task& task, const tensor_registry& registry);

/// Checks a set of tasks (one owner's, or a whole model's): each task on its own (validate_task,
/// validate_residual_task), residual task names unique, and every residual output produced by
/// exactly one task: no other residual task and no affine task may target it (several affine
/// tasks may share a tensor, e.g. the row blocks of a split). Throws dcr::error naming both
/// producers of a contested tensor.
void validate_task_set(const tensor_registry& registry,
                       std::span<const affine_task> affine,
                       std::span<const residual_task> residual);

/// Canonical checkpoint bytes by the kind of task that produces them.
struct task_coverage {
  std::uint64_t checkpoint_bytes = 0;  ///< every tensor of the registry
  std::uint64_t affine_bytes = 0;      ///< tensors targeted by affine tasks
  std::uint64_t residual_bytes = 0;    ///< tensors built by residual tasks
  std::uint64_t uncovered_bytes = 0;   ///< tensors no task produces (not refit by these tasks)

  /// Share of the covered bytes that affine tasks cover, affine / (affine + residual); 1 when
  /// nothing is covered. The paper reports above 0.96 for its MoE checkpoints.
  [[nodiscard]] double affine_share() const noexcept {
    const std::uint64_t covered = affine_bytes + residual_bytes;
    return covered == 0 ? 1.0 : static_cast<double>(affine_bytes) / static_cast<double>(covered);
  }
};

/// Bytes of the canonical checkpoint covered by affine vs residual tasks. Counts each tensor
/// once, whatever number of tasks (splits, replicas) targets it. Validates the set first
/// (validate_task_set), so a tensor is never counted on both sides.
task_coverage measure_coverage(const tensor_registry& registry,
                               std::span<const affine_task> affine,
                               std::span<const residual_task> residual);

}  // namespace dcr

#include "dcr/detail/refit/residual.inl"
