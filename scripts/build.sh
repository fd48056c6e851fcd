#!/usr/bin/env bash
# build.sh [--target NAME]... [SETUP-ARGS]: installs missing dependencies, configures build/ once
# (release, CUDA parts when nvcc is found) and compiles with ninja through ccache: everything, or
# with --target only the named meson targets and what they depend on (scripts/simulate.sh builds
# just the `dcr` tool that way). Other arguments go to the first `meson setup` (e.g.
# -Dcuda=disabled). A second run with nothing changed is near-instant.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

targets=()
setup_args=()
while (($#)); do
  case $1 in
    --target) targets+=("${2:?build.sh: --target needs a meson target name}"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    *) setup_args+=("$1"); shift ;;
  esac
done
set -- "${setup_args[@]}"

scripts/install-deps.sh

# meson finds nvcc on PATH only; the CUDA toolkit's usual home is not always on it.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# meson wraps the compilers in ccache when ccache is on PATH (install-deps puts it in /usr/bin).
command -v ccache >/dev/null || echo "build: ccache not on PATH, building without it" >&2

# Configure once; meson regenerates by itself when a meson.build changes.
if [[ ! -f build/meson-private/coredata.dat ]]; then
  meson setup build --buildtype=release "$@"
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
