// examples/separate_compilation_etcd.cpp: the etcd control plane's bodies
// (dcr/protocol/plane/etcd_control_plane.hpp) compiled once, for a program built with
// DCR_SEPARATE_COMPILATION and DCR_SEPARATE_NETWORK (dcr/config.hpp). One unit per networked
// header, so that a program links only the clients it uses; dcr's own build makes each a static
// library beside dcr_core (meson.build).
#define DCR_SEPARATE_LIBRARY_PART DCR_PART_NETWORK
#include "dcr/separate_compilation.hpp"
#include "dcr/protocol/plane/etcd_control_plane.hpp"
