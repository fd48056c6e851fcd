// dcr/refit/detect_backend.hpp: the hook through which an owner runs its detect stage (and the
// projection of what it found) somewhere else than its own SIMD compare loop: on another
// execution policy, e.g. a GPU (dcr::exec::policy_detect_backend in dcr/exec/refit.hpp, built
// with the CUDA policy by an nvcc translation unit).
//
// The owner stays the one implementation of everything around detection (union of the changed
// sets across attempts, records per canonical tensor, encodings, residual tasks, trackers for
// restores); a backend only answers "which local indices of task i changed, and where do they
// land". The owner keeps its own trackers (the committed words: what a restore sends, what its
// commit writes) and tells the backend of every change to them, so a backend's own trackers
// (device memory) stay bit-equal to the owner's. Host-compilable, no CUDA types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/refit/task.hpp"

namespace dcr {

/// The canonical coordinates of the changes a backend detected, projected where it ran.
struct projected_changes {
  std::vector<std::uint64_t> index;  ///< canonical flat index of changed[k]
  std::vector<std::uint32_t> part;   ///< target part of changed[k] (empty: single-target task)
  bool valid = false;                ///< false: the owner projects changed[] itself
};

/// An owner's detect stage run elsewhere (see the file comment). Installed with
/// owner::set_detect_backend; the owner calls it from build_items / build_chunk (mode
/// `changes`), initialize and commit, on the calling thread.
class detect_backend {
 public:
  virtual ~detect_backend() = default;

  /// Where detection and projection run, for reports ("cpu", "cuda").
  [[nodiscard]] virtual std::string device() const = 0;

  /// The owner's affine tasks, and their trackers set to `committed` (committed[i] for
  /// tasks[i]): owner::initialize, or set_detect_backend on an initialized owner. Sizes every
  /// buffer the backend needs; later calls allocate nothing (the changed sets excepted).
  virtual void initialize(std::span<const affine_task> tasks,
                          std::span<const std::span<const std::byte>> committed) = 0;

  /// Task `task`'s local indices whose words in `candidate` differ in any bit from its tracker,
  /// sorted, into `changed` (replacing its contents); their canonical coordinates into
  /// `projected` (or projected.valid = false). Must equal dcr::detect_changes bit for bit.
  virtual void detect(std::size_t task, std::span<const std::byte> candidate,
                      std::vector<std::uint64_t>& changed, projected_changes& projected) = 0;

  /// After the joint commit: the tracker of task `task` takes the words of `candidate` at the
  /// local indices `changed` (sorted, distinct), or every word when `dense`.
  virtual void commit(std::size_t task, std::span<const std::byte> candidate,
                      std::span<const std::uint64_t> changed, bool dense) = 0;
};

/// A detect backend whose trackers can be read back, to check them against the owner's.
class mirrored_detect_backend : public detect_backend {
 public:
  /// The tracker of task `task` as the backend holds it, copied to the host.
  [[nodiscard]] virtual std::vector<std::byte> tracker(std::size_t task) = 0;
};

}  // namespace dcr
