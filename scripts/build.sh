#!/usr/bin/env bash
# build.sh: installs missing dependencies, configures build/ once (release, CUDA parts when nvcc is
# found) and compiles everything with ninja through ccache. Extra arguments go to the first
# `meson setup` (e.g. -Dcuda=disabled). A second run with nothing changed is near-instant.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

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
meson compile -C build -j "${DCR_JOBS:-$(nproc)}"
