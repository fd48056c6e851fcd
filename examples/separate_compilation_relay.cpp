// examples/separate_compilation_relay.cpp: the relay transport's bodies
// (dcr/protocol/relay/relay.hpp) compiled once, for a program built with DCR_SEPARATE_COMPILATION
// and DCR_SEPARATE_NETWORK (dcr/config.hpp). One unit per networked header, so that a program links
// only the clients it uses; dcr's own build makes each a static library beside dcr_core
// (meson.build).
#define DCR_SEPARATE_LIBRARY_PART DCR_PART_NETWORK
#include "dcr/separate_compilation.hpp"
#include "dcr/protocol/relay/relay.hpp"
