#!/usr/bin/env bash
# build.sh [--deps tool|all] [--target NAME]... [SETUP-ARGS]: installs missing dependencies
# (scripts/install-deps.sh --for tool|all; default all), configures build/ once (release, CUDA
# parts when nvcc is found) and compiles with ninja through ccache: everything, or with --target
# only the named meson targets and what they depend on (scripts/simulate.sh builds just the `dcr`
# tool that way, over `--deps tool`). Other arguments go to the first `meson setup` (e.g.
# -Dcuda=disabled). A build/ configured over the tool's packages alone is reconfigured once the
# full set is installed, so the parts that were not found then (tests, benchmarks, Python) are
# built. A second run with nothing changed is near-instant.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

targets=()
setup_args=()
deps=all
while (($#)); do
  case $1 in
    --deps) deps=${2:?build.sh: --deps needs tool or all}; shift 2 ;;
    --deps=*) deps=${1#--deps=}; shift ;;
    --target) targets+=("${2:?build.sh: --target needs a meson target name}"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    *) setup_args+=("$1"); shift ;;
  esac
done
set -- "${setup_args[@]}"

scripts/install-deps.sh --for "$deps"

# meson finds nvcc on PATH only; the CUDA toolkit's usual home is not always on it.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# meson wraps the compilers in ccache when ccache is on PATH (install-deps puts it in /usr/bin).
command -v ccache >/dev/null || echo "build: ccache not on PATH, building without it" >&2

# Configure once; meson regenerates by itself when a meson.build changes. build/.dcr-deps names
# the package set build/ was configured over (a build/ without it: the full set).
if [[ ! -f build/meson-private/coredata.dat ]]; then
  meson setup build --buildtype=release "$@"
  echo "$deps" > build/.dcr-deps
elif [[ $deps == all && $(cat build/.dcr-deps 2>/dev/null || echo all) == tool ]]; then
  echo "build: build/ was configured over the dcr tool's packages only, reconfiguring over all" >&2
  meson configure --clearcache build   # forget what the first configure found or missed
  meson setup --reconfigure build "$@"
  echo all > build/.dcr-deps
else
  # A build directory configured by another meson (e.g. pip's, installed later for the Python
  # package, shadowing Debian's) cannot be compiled by this one until it is reconfigured.
  configured=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["meson_version"]["full"])' \
                 build/meson-info/meson-info.json 2>/dev/null || true)
  if [[ $configured != "$(meson --version)" ]]; then
    echo "build: build/ was configured by meson ${configured:-?}, reconfiguring for $(meson --version)" >&2
    meson setup --reconfigure build "$@"
  fi
fi
meson compile -C build -j "${DCR_JOBS:-$(nproc)}" "${targets[@]}"
