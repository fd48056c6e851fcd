// tools/dcr/simulate_backends.hpp: the detect and apply backends `dcr simulate` installs in its
// owners and receivers (dcr/refit/detect_backend.hpp, dcr/apply/apply_backend.hpp) for a
// --device: none for cpu (the owner's and receiver's own loops), the CUDA ones of
// simulate_cuda.hpp for cuda.
//
// Test hook: with DCR_SIMULATE_CPU_BACKENDS=1 in the environment, `--device cpu` installs the
// same policy-generic backends (dcr/exec/refit.hpp) on the CPU policy (reported as device
// "cpu-exec"), into host copies of the trackers and storage, so the tool's whole device
// plumbing (backends in every process, storage copied after dense loads and back before
// verification, restarts) runs where no GPU is. Compiled apply path only. It never affects
// --device cuda.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "dcr/apply/apply_backend.hpp"
#include "dcr/exec/device.hpp"
#include "dcr/refit/detect_backend.hpp"

namespace dcr_tool {

/// The detect backend of owner `id` for `device`; nullptr: the owner's own CPU loop.
std::unique_ptr<dcr::mirrored_detect_backend> make_detect_backend(dcr::exec::device_kind device,
                                                                 int id);

/// The apply backend of receiver `id` for `device` over the storage's host `buffers`; nullptr:
/// the receiver's own CPU loop. Call upload_storage() once the buffers hold the start state.
std::unique_ptr<dcr::mirrored_apply_backend> make_apply_backend(
    dcr::exec::device_kind device, std::span<const std::span<std::byte>> buffers, int id);

}  // namespace dcr_tool
