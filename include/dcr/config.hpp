// dcr/config.hpp: compiler and platform switches shared by every dcr header.
//
// DCR_HOST_DEVICE marks per-element functors that run unchanged on the CPU and on a CUDA device.
// It expands to `__host__ __device__` under nvcc and to nothing under a plain C++ compiler, so
// every public header compiles with g++/clang++ alone.
//
// Header-only by default; separate compilation on request. The core headers (those the
// umbrella dcr/dcr.hpp includes) declare their non-template functions in the header and define
// them in detail/<area>/<header>.inl, marked DCR_INLINE:
//   * header-only (the default): each header includes its .inl and DCR_INLINE is `inline`, so a
//     program needs nothing but the headers. Every translation unit that calls into the refit
//     path then compiles that path again (about 45 s of CPU at -O2 for a receiver and the
//     in-process driver);
//   * separate compilation: define DCR_SEPARATE_COMPILATION for every translation unit of the
//     program and include dcr/separate_compilation.hpp in exactly one of them. The other units
//     see declarations only and compile just what depends on their own types (a loader, a
//     control plane), and that one unit defines the library's functions once. Templates
//     (receiver<Loader>, coordinator<Plane, Store>, ...) stay in headers in both modes.
// Mixing the two modes in one program is an ODR violation; link errors for dcr functions in
// separate mode mean the unit with dcr/separate_compilation.hpp is missing.
#pragma once

#define DCR_CONFIG_INCLUDED 1

#if defined(DCR_SEPARATE_COMPILATION)
#define DCR_INLINE
#if defined(DCR_BUILDING_SEPARATE_LIBRARY)
#define DCR_HEADER_BODIES 1
#else
#define DCR_HEADER_BODIES 0
#endif
#else
/// `inline` in header-only mode; nothing when the library is compiled separately.
#define DCR_INLINE inline
/// 1 where this translation unit defines the core's non-template functions (header-only mode,
/// or the one unit with dcr/separate_compilation.hpp).
#define DCR_HEADER_BODIES 1
#endif

/// The library's bodies come in two parts: DCR_PART_REFIT (shapes, canonical coordinates, the
/// apply path, the refit tasks, owner and receiver) and DCR_PART_PROTOCOL (the payload codec
/// and the protocol). The unit with dcr/separate_compilation.hpp defines both; a program may
/// instead split it in two units, each defining DCR_SEPARATE_LIBRARY_PART to one part's number
/// before that include, so that the two compile in parallel (dcr's own build does). Each .inl
/// guards its bodies with DCR_HEADER_BODIES_OF(its part).
///
/// The networked parts outside the umbrella (dcr/protocol/plane/etcd_control_plane.hpp,
/// dcr/protocol/store/s3_payload_store.hpp, dcr/protocol/relay/relay.hpp), DCR_PART_NETWORK,
/// stay header-only in both modes unless the program also defines DCR_SEPARATE_NETWORK for
/// every unit. Then their bodies (marked DCR_NETWORK_INLINE) are defined once, by the library
/// unit that includes them after dcr/separate_compilation.hpp: the one unit, or a unit of its
/// own with DCR_SEPARATE_LIBRARY_PART set to DCR_PART_NETWORK (one per header, so that a program
/// links only the clients it uses: examples/separate_compilation_{etcd,s3,relay}.cpp).
#define DCR_PART_REFIT 1
#define DCR_PART_PROTOCOL 2
#define DCR_PART_NETWORK 3
#if defined(DCR_SEPARATE_NETWORK) && !defined(DCR_SEPARATE_COMPILATION)
#error "DCR_SEPARATE_NETWORK needs DCR_SEPARATE_COMPILATION as well (dcr/config.hpp)"
#endif
#if defined(DCR_SEPARATE_NETWORK)
/// Nothing: the networked parts' bodies are compiled once (DCR_SEPARATE_NETWORK).
#define DCR_NETWORK_INLINE
#if defined(DCR_BUILDING_SEPARATE_LIBRARY) && \
    (!defined(DCR_SEPARATE_LIBRARY_PART) || DCR_SEPARATE_LIBRARY_PART == DCR_PART_NETWORK)
#define DCR_NETWORK_BODIES 1
#else
#define DCR_NETWORK_BODIES 0
#endif
#else
/// `inline`: the networked parts are header-only (the default, in both modes).
#define DCR_NETWORK_INLINE inline
#define DCR_NETWORK_BODIES 1
#endif
#if defined(DCR_BUILDING_SEPARATE_LIBRARY) && defined(DCR_SEPARATE_LIBRARY_PART)
#define DCR_CORE_BODIES_OF(part) (DCR_SEPARATE_LIBRARY_PART == (part))
#else
#define DCR_CORE_BODIES_OF(part) DCR_HEADER_BODIES
#endif
/// 1 where this unit defines the bodies of `part` (a .inl's guard).
#define DCR_HEADER_BODIES_OF(part) \
  ((part) == DCR_PART_NETWORK ? DCR_NETWORK_BODIES : DCR_CORE_BODIES_OF(part))

#if defined(DCR_SEPARATE_COMPILATION)
/// Separate compilation only: `extern template` (an explicit instantiation declaration) where
/// the program's units use a template dcr instantiates once for them, `template` (the
/// definition) in the unit with dcr/separate_compilation.hpp (of DCR_PART_REFIT, where the
/// explicit instantiations are, when that unit is split).
#if defined(DCR_BUILDING_SEPARATE_LIBRARY) && \
    (!defined(DCR_SEPARATE_LIBRARY_PART) || DCR_SEPARATE_LIBRARY_PART == DCR_PART_REFIT)
#define DCR_EXPLICIT_INSTANTIATION template
#else
#define DCR_EXPLICIT_INSTANTIATION extern template
#endif
#endif

/// Expands X(W, D) for every pair of storage words (a copy's source and destination widths).
#define DCR_FOR_EACH_WORD_PAIR(X)                                                      \
  X(std::uint8_t, std::uint8_t) X(std::uint8_t, std::uint16_t) X(std::uint8_t, std::uint32_t)  \
  X(std::uint8_t, std::uint64_t) X(std::uint16_t, std::uint8_t) X(std::uint16_t, std::uint16_t) \
  X(std::uint16_t, std::uint32_t) X(std::uint16_t, std::uint64_t) X(std::uint32_t, std::uint8_t) \
  X(std::uint32_t, std::uint16_t) X(std::uint32_t, std::uint32_t) X(std::uint32_t, std::uint64_t) \
  X(std::uint64_t, std::uint8_t) X(std::uint64_t, std::uint16_t) X(std::uint64_t, std::uint32_t) \
  X(std::uint64_t, std::uint64_t)

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
