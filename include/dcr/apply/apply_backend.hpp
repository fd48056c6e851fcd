// dcr/apply/apply_backend.hpp: the hook through which a receiver's compiled-path apply writes
// somewhere else than through the CPU loop: on another execution policy, e.g. a GPU holding the
// engine's weights (dcr::exec::policy_apply_backend in dcr/exec/refit.hpp, built with the CUDA
// policy by an nvcc translation unit).
//
// The receiver stays the one implementation of everything around the write (decode, checksum,
// deduplication, fencing, the per-item validation against the plan, all before the first
// write); a backend only runs the per-record step (dcr/apply/record.hpp) of validated items
// through the plan's placement records, in the storage it holds. Host-compilable, no CUDA types.
#pragma once

#include <cstdint>
#include <string>

#include "dcr/apply/placement.hpp"
#include "dcr/codec/item.hpp"

namespace dcr {

/// The compiled-path write of a receiver run elsewhere (see the file comment). Installed with
/// receiver::set_apply_backend (item_applier::set_backend); called on the applying thread.
/// Only the compiled path runs through a backend: the general path's loader and the post-apply
/// checks read and write the engine's host storage, so item_applier refuses them (before any
/// write) while a backend is installed. Dense loads still go through the loader into host
/// storage: whoever owns the storage keeps the backend's copy in step with it.
class apply_backend {
 public:
  virtual ~apply_backend() = default;

  /// Where the apply runs, for reports ("cpu", "cuda").
  [[nodiscard]] virtual std::string device() const = 0;

  /// The receiver compiled `plan` (prewarm, or set_backend on a prewarmed receiver): the
  /// records the following apply() calls go through, with dst pointers into the engine's host
  /// storage as the loader's views held them. Sizes what the backend needs.
  virtual void prepare(const placement_plan& plan) = 0;

  /// Applies item `it` (validated against the plan; its tensor is not skipped) through
  /// plan.placements_of(it.tensor); returns the writes (replicas count each), exactly what
  /// dcr::apply_item_records returns for the same records.
  virtual std::uint64_t apply(const item& it) = 0;
};

/// An apply backend that writes into a copy of the engine storage it holds itself (in device
/// memory, say: dcr::exec::policy_apply_backend). Whoever owns the storage moves it between the
/// engine's host buffers and that copy.
class mirrored_apply_backend : public apply_backend {
 public:
  /// Host storage -> the backend's copy (after a dense load through the loader wrote the host).
  virtual void upload_storage() = 0;
  /// The backend's copy -> host storage (to compare it with a dense refit, or to serve from it).
  virtual void download_storage() = 0;
};

}  // namespace dcr
