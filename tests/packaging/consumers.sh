#!/usr/bin/env bash
# consumers.sh MODE SOURCE_ROOT MESON VERSION: dcr used by a project outside it, each way
# docs/packaging.md describes, with the consumer program of tests/packaging/consumer/ built and run
# (change detection over a tensor view, a payload encoded and decoded bit for bit).
#
#   pkg-config  install dcr into a temporary prefix; check what its pkg-config modules hand out
#               (no -std, no -pthread, the parts' Requires); a Meson project asking for C++23
#               finds dcr and dcr-io with pkg-config
#   subproject  a Meson project with dcr in subprojects/ and docs/dcr.wrap as its wrap file;
#               dcr must build nothing of its own there (no targets, no tests)
#   cmake       install, then move the prefix (the CMake files find the headers relative to
#               themselves); a CMake project with find_package(dcr CONFIG), a C++23 target on
#               dcr::io and, where nvcc is found, a CUDA target on dcr::kernels
#   nvcc        install; nvcc $(pkg-config --cflags dcr-kernels) app.cu; exit 77 (meson: SKIP)
#               where nvcc is not installed
#
# Everything happens in a temporary directory, removed at exit; the source tree is only read.
set -euo pipefail

mode=$1 src=$2 meson=$3 version=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dcr-packaging.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() { echo "packaging ($mode): FAILED: $*" >&2; exit 1; }
# Runs a step quietly; on failure prints its output and stops.
step() {
  local what=$1; shift
  if ! "$@" >"$tmp/step.log" 2>&1; then
    cat "$tmp/step.log" >&2
    fail "$what"
  fi
}
find_nvcc() {
  if command -v nvcc >/dev/null; then command -v nvcc
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then echo /usr/local/cuda/bin/nvcc
  fi
}

# The library alone, installed into $tmp/prefix; PKG_CONFIG_PATH points at its modules.
install_dcr() {
  step "meson setup of dcr" "$meson" setup "$tmp/dcr-build" "$src" --prefix="$tmp/prefix" \
    -Dtests=disabled -Dbenchmarks=disabled -Dexamples=disabled -Dtools=disabled \
    -Dpython=disabled -Dcuda=disabled
  step "meson install of dcr" "$meson" install -C "$tmp/dcr-build" --quiet
  local d
  for d in sim testing; do
    [[ ! -e $tmp/prefix/include/dcr/$d ]] || fail "include/dcr/$d installed (test-only code)"
  done
  [[ -f $tmp/prefix/include/dcr/version.hpp ]] || fail "dcr/version.hpp not installed"
  local pc
  pc=$(find "$tmp/prefix" -name dcr.pc -print -quit)
  [[ -n $pc ]] || fail "no dcr.pc installed"
  export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
}

check_pkg_config_modules() {
  local m flags
  [[ $(pkg-config --modversion dcr) == "$version" ]] ||
    fail "pkg-config says dcr $(pkg-config --modversion dcr), the project is $version"
  for m in dcr dcr-io dcr-etcd dcr-s3 dcr-relay dcr-kernels; do
    flags=$(pkg-config --cflags --libs "$m") || fail "pkg-config $m"
    [[ " $flags " != *" -std="* ]] || fail "$m hands out a -std flag: $flags"
    [[ " $flags " != *" -pthread "* ]] || fail "$m hands out -pthread (nvcc refuses it): $flags"
    [[ " $flags " == *" -I$tmp/prefix/include "* ]] || fail "$m lacks -I$tmp/prefix/include: $flags"
  done
  # What each part's headers include beyond the core (docs/packaging.md).
  local -A needs=([dcr]="libzstd libxxhash nlohmann_json" [dcr-io]="dcr nlohmann_json"
                  [dcr-etcd]="dcr libcurl" [dcr-s3]="dcr libcurl libcrypto"
                  [dcr-relay]="dcr openssl" [dcr-kernels]="dcr")
  local r requires
  for m in "${!needs[@]}"; do
    requires=" $(pkg-config --print-requires "$m" | awk '{print $1}' | tr '\n' ' ') "
    for r in ${needs[$m]}; do
      [[ $requires == *" $r "* ]] || fail "$m does not require $r (it requires:$requires)"
    done
  done
  [[ $(pkg-config --cflags dcr-kernels) == *--expt-relaxed-constexpr* ]] ||
    fail "dcr-kernels lacks --expt-relaxed-constexpr"
}

case $mode in
  pkg-config)
    install_dcr
    check_pkg_config_modules
    cp -r "$src/tests/packaging/consumer" "$tmp/consumer"
    step "meson setup of the consumer" "$meson" setup "$tmp/consumer-build" "$tmp/consumer" \
      -Ddcr_from=pkg-config
    step "the consumer's build and tests" "$meson" test -C "$tmp/consumer-build" --print-errorlogs
    "$tmp/consumer-build/app"
    ;;

  subproject)
    cp -r "$src/tests/packaging/consumer" "$tmp/consumer"
    mkdir "$tmp/consumer/subprojects"
    ln -s "$(cd "$src" && pwd)" "$tmp/consumer/subprojects/dcr"
    cp "$src/docs/dcr.wrap" "$tmp/consumer/subprojects/dcr.wrap"
    # Forced fallback: an installed dcr must not stand in for the subproject.
    step "meson setup of the consumer" "$meson" setup "$tmp/consumer-build" "$tmp/consumer" \
      -Ddcr_from=subproject --wrap-mode=nodownload --force-fallback-for=dcr,dcr-io
    # Checked before building: a dcr that defined its tests here would build and run them all.
    "$meson" introspect --targets --tests "$tmp/consumer-build" >"$tmp/introspect.json"
    python3 - "$tmp/introspect.json" <<'PY' || fail "dcr builds or tests its own parts as a subproject"
import json, sys
info = json.load(open(sys.argv[1]))
targets = [t["name"] for t in info["targets"] if t.get("subproject") == "dcr"]
tests = [t["name"] for t in info["tests"]
         if any(s == "dcr" or s.startswith("dcr:") for s in t["suite"])]
if targets or tests:
    print("packaging (subproject): dcr's targets", targets, "and tests", tests, file=sys.stderr)
    sys.exit(1)
print("packaging (subproject): dcr defined no targets and no tests")
PY
    step "the consumer's build and tests" "$meson" test -C "$tmp/consumer-build" --print-errorlogs
    "$tmp/consumer-build/app"
    ;;

  cmake)
    command -v cmake >/dev/null || fail "cmake not installed (scripts/install-deps.sh installs it)"
    install_dcr
    mv "$tmp/prefix" "$tmp/moved-prefix"
    args=(-G Ninja "-DCMAKE_PREFIX_PATH=$tmp/moved-prefix")
    nvcc=$(find_nvcc)
    if [[ -n $nvcc ]]; then
      args+=(-DWITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
    else
      echo "packaging (cmake): no nvcc; the CUDA target is left out"
    fi
    step "cmake configure of the consumer" cmake -S "$src/tests/packaging/consumer" \
      -B "$tmp/consumer-build" "${args[@]}"
    step "cmake build of the consumer" cmake --build "$tmp/consumer-build"
    "$tmp/consumer-build/app"
    if [[ -n $nvcc ]]; then "$tmp/consumer-build/kernels"; fi
    ;;

  nvcc)
    nvcc=$(find_nvcc)
    if [[ -z $nvcc ]]; then echo "packaging (nvcc): nvcc not installed: skipped"; exit 77; fi
    install_dcr
    read -ra cflags <<<"$(pkg-config --cflags dcr-kernels)"
    read -ra libs <<<"$(pkg-config --libs dcr-kernels)"
    step "nvcc" "$nvcc" -std=c++20 -arch=sm_90 '-DDCR_CONSUMER_NAME="nvcc"' "${cflags[@]}" \
      "$src/tests/packaging/consumer/app.cu" -o "$tmp/app" "${libs[@]}"
    "$tmp/app"
    ;;

  *) echo "consumers.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
