// examples/separate_compilation_protocol.cpp: half of dcr's core compiled once, for a program built
// with DCR_SEPARATE_COMPILATION that splits examples/separate_compilation.cpp in two units which
// compile in parallel: this one defines the bodies of DCR_PART_PROTOCOL (dcr/config.hpp), its
// sibling separate_compilation_refit.cpp the rest. dcr's own build links both into
// the static library dcr_core (meson.build); docs/packaging.md has the compile times.
#define DCR_SEPARATE_LIBRARY_PART DCR_PART_PROTOCOL
#include "dcr/separate_compilation.hpp"
