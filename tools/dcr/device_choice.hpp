// tools/dcr/device_choice.hpp: the `dcr` tool's `--device cpu|cuda`: parsing the flag and
// confirming that the chosen device can run here, with an answer that tells the user what to do
// (run with --device cpu, or rebuild with the CUDA backend) when it cannot.
//
//     const auto sel = dcr_tool::select_device(dcr_tool::parse_device(flag_value));
//     // cpu: sel.kind == device_kind::cpu; cuda: a device is present, sel.description names it;
//     // otherwise select_device threw dcr::error(errc::device_error, "... no CUDA device present ...")
#pragma once

#include <string>
#include <string_view>

#include "dcr/error.hpp"
#include "dcr/exec/device.hpp"

namespace dcr_tool {

/// "cpu" or "cuda" (as `--device` takes). Throws dcr::error(errc::invalid_argument) otherwise.
inline dcr::exec::device_kind parse_device(std::string_view name) {
  if (name == "cpu") return dcr::exec::device_kind::cpu;
  if (name == "cuda") return dcr::exec::device_kind::cuda;
  throw dcr::error(dcr::errc::invalid_argument,
                   "--device: unknown device '" + std::string(name) + "' (expected cpu or cuda)");
}

/// The device a run uses, and how to describe it in a summary line.
struct device_selection {
  dcr::exec::device_kind kind = dcr::exec::device_kind::cpu;
  std::string description;  ///< "cpu" or "cuda: <device 0 name> (<n> devices)"
};

/// Confirms that `requested` can run here. cpu always can. cuda needs a device the driver sees
/// (dcr::exec::probe_cuda) and a build with the CUDA backend; otherwise throws
/// dcr::error(errc::device_error) with a message that says "no CUDA device present" and why
/// (or that the build lacks the backend and how to configure one).
inline device_selection select_device(dcr::exec::device_kind requested,
                                      bool backend_compiled = dcr::exec::cuda_backend_compiled) {
  device_selection s;
  s.kind = requested;
  if (requested == dcr::exec::device_kind::cpu) {
    s.description = "cpu";
    return s;
  }
  const dcr::exec::cuda_probe p = dcr::exec::probe_cuda();
  DCR_EXPECTS(p.devices > 0, dcr::errc::device_error,
              "--device cuda: no CUDA device present (" + p.detail + "); run with --device cpu");
  DCR_EXPECTS(backend_compiled, dcr::errc::device_error,
              "--device cuda: this build has no CUDA backend (configure with -Dcuda=enabled "
              "and nvcc on PATH); run with --device cpu");
  s.description = "cuda: " + (p.name.empty() ? std::string("device 0") : p.name) + " (" +
                  std::to_string(p.devices) + (p.devices == 1 ? " device)" : " devices)");
  return s;
}

}  // namespace dcr_tool
