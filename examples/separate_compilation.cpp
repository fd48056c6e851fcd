// examples/separate_compilation.cpp: dcr's core compiled once, for a program built with
// DCR_SEPARATE_COMPILATION.
//
// dcr is header-only by default: every translation unit that uses the refit path compiles it
// again. A program with many such units (or one that recompiles often) can instead define
// DCR_SEPARATE_COMPILATION for all of its units and compile this one file with them; the other
// units then see declarations only and compile just the templates they instantiate with their
// own types (the loader, here). dcr's own build uses this very file so: meson.build compiles it
// into the static library dcr_core that the tool, the tests, the benchmarks, the examples and
// the Python extension link (split in its two parts, separate_compilation_{refit,protocol}.cpp);
// docs/benchmarks.md has the compile times.
#include "dcr/separate_compilation.hpp"
