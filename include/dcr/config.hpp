// dcr/config.hpp: compiler and platform switches shared by every dcr header.
//
// DCR_HOST_DEVICE marks per-element functors that run unchanged on the CPU and on a CUDA device.
// It expands to `__host__ __device__` under nvcc and to nothing under a plain C++ compiler, so
// every public header compiles with g++/clang++ alone.
#pragma once

#if defined(__CUDACC__)
#define DCR_HOST_DEVICE __host__ __device__
#define DCR_DEVICE_COMPILE 1
#else
#define DCR_HOST_DEVICE
#define DCR_DEVICE_COMPILE 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DCR_LIKELY(x) __builtin_expect(!!(x), 1)
#define DCR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define DCR_FORCE_INLINE inline __attribute__((always_inline))
#else
#define DCR_LIKELY(x) (x)
#define DCR_UNLIKELY(x) (x)
#define DCR_FORCE_INLINE inline
#endif

#if !defined(__cplusplus) || __cplusplus < 202002L
#if !defined(_MSVC_LANG) || _MSVC_LANG < 202002L
#error "dcr requires C++20"
#endif
#endif

#include "dcr/version.hpp"
