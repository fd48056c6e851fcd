// dcr/exec/device.hpp: what CUDA this process can use: whether the caller was built with the
// CUDA backend, and what the CUDA driver reports (device count, device 0's name, or why there
// is none).
//
// Host-compilable, no CUDA headers: the probe loads the CUDA driver library (libcuda.so.1) at
// run time with dlopen and asks it for the device count, so a binary built without nvcc (or
// run on a machine without a driver) still reports exactly why CUDA is not available. What
// runs on the device is the CUDA backend of dcr/exec (kernels/dcr/kernels/exec.cuh), compiled
// into a translation unit built with nvcc; `cuda_backend_compiled` says whether the caller was
// built with one (it passes DCR_HAVE_CUDA_BACKEND=1). Choosing a device from a command line
// (the `dcr` tool's `--device`) is the tool's business (tools/dcr/device_choice.hpp).
#pragma once

#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define DCR_HAVE_DLOPEN 1
#else
#define DCR_HAVE_DLOPEN 0
#endif

namespace dcr::exec {

/// Where the data-parallel steps run.
enum class device_kind : unsigned char { cpu = 0, cuda = 1 };

inline const char* device_name(device_kind k) noexcept {
  return k == device_kind::cuda ? "cuda" : "cpu";
}

/// Whether this translation unit was built with the CUDA backend (DCR_HAVE_CUDA_BACKEND=1, set
/// by builds that compile kernels/dcr/kernels/exec.cuh with nvcc).
#if defined(DCR_HAVE_CUDA_BACKEND) && DCR_HAVE_CUDA_BACKEND
inline constexpr bool cuda_backend_compiled = true;
#else
inline constexpr bool cuda_backend_compiled = false;
#endif

/// What the CUDA driver reports.
struct cuda_probe {
  bool driver = false;  ///< libcuda.so.1 loaded and cuInit succeeded
  int devices = 0;      ///< device count (0 without a driver)
  std::string name;     ///< name of device 0, when there is one
  std::string detail;   ///< why there is no device, in words ("" when there is one)
};

/// Asks the CUDA driver (loaded with dlopen, never linked) how many devices there are.
inline cuda_probe probe_cuda() {
  cuda_probe p;
#if DCR_HAVE_DLOPEN
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    p.detail = "the CUDA driver library libcuda.so.1 is not installed";
    return p;
  }
  using init_fn = int (*)(unsigned);
  using count_fn = int (*)(int*);
  using get_fn = int (*)(int*, int);
  using name_fn = int (*)(char*, int, int);
  const auto init = reinterpret_cast<init_fn>(::dlsym(lib, "cuInit"));
  const auto count = reinterpret_cast<count_fn>(::dlsym(lib, "cuDeviceGetCount"));
  const auto get = reinterpret_cast<get_fn>(::dlsym(lib, "cuDeviceGet"));
  const auto name = reinterpret_cast<name_fn>(::dlsym(lib, "cuDeviceGetName"));
  if (init == nullptr || count == nullptr) {
    p.detail = "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
  } else if (const int rc = init(0); rc != 0) {
    p.detail = "the CUDA driver failed to initialize (CUresult " + std::to_string(rc) +
               (rc == 100 ? ": no CUDA-capable device is detected)" : ")");
  } else {
    p.driver = true;
    if (count(&p.devices) != 0) p.devices = 0;
    if (p.devices == 0) {
      p.detail = "the CUDA driver reports 0 devices";
    } else if (get != nullptr && name != nullptr) {
      int dev = 0;
      char buf[256] = {};
      if (get(&dev, 0) == 0 && name(buf, static_cast<int>(sizeof buf - 1), dev) == 0) p.name = buf;
    }
  }
  ::dlclose(lib);
#else
  p.detail = "this platform cannot load the CUDA driver at run time";
#endif
  return p;
}

}  // namespace dcr::exec
