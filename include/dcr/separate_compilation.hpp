// dcr/separate_compilation.hpp: the translation unit that compiles dcr's core once.
//
// For programs built with DCR_SEPARATE_COMPILATION (see dcr/config.hpp): include this header,
// before any other dcr header, in exactly one .cpp file of the program, compiled with the same
// DCR_SEPARATE_COMPILATION definition and flags as the rest:
//
//     // dcr_library.cpp
//     #include <dcr/separate_compilation.hpp>
//
// That unit defines every non-template function of the headers dcr/dcr.hpp includes; the
// program's other units then compile only the templates they instantiate with their own types.
// It may be split in two units that compile in parallel: each defines DCR_SEPARATE_LIBRARY_PART
// to DCR_PART_REFIT or DCR_PART_PROTOCOL before this include and defines that part's bodies
// (dcr/config.hpp; examples/separate_compilation_{refit,protocol}.cpp).
// Headers outside the umbrella (dcr/io/, dcr/exec/, the networked clients) stay header-only
// by default in both modes and need nothing here. The networked ones (the etcd control
// plane, the S3 store, the relay) may be compiled once too: define DCR_SEPARATE_NETWORK as well
// for every unit, and include each such header the program uses after this one, in the one
// unit or in a unit of part DCR_PART_NETWORK (dcr/config.hpp):
//
//     // dcr_etcd.cpp
//     #define DCR_SEPARATE_LIBRARY_PART DCR_PART_NETWORK
//     #include <dcr/separate_compilation.hpp>
//     #include <dcr/protocol/plane/etcd_control_plane.hpp>
#pragma once

#if !defined(DCR_SEPARATE_COMPILATION)
#error "dcr/separate_compilation.hpp: define DCR_SEPARATE_COMPILATION for every translation unit of the program"
#endif
#if defined(DCR_CONFIG_INCLUDED)
#error "dcr/separate_compilation.hpp must come before any other dcr header in its translation unit"
#endif

#define DCR_BUILDING_SEPARATE_LIBRARY 1
#include "dcr/dcr.hpp"
