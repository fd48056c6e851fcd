#!/usr/bin/env bash
# simulate.sh: the main job. Installs, builds, then runs `dcr simulate` (an end-to-end refit of
# a synthetic MoE-shaped model, checked bit for bit against a dense refit) on its embedded
# defaults; arguments go to `dcr simulate` (try --help). It installs only what the tool needs (no
# pip packages) and compiles only the `dcr` tool and what that links (no tests, benchmarks,
# examples or Python package: scripts/test.sh installs and builds those).
# Build output goes to stderr so that `scripts/simulate.sh --json` prints only the JSON report on
# stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/build.sh --deps tool --target dcr >&2

dcr=build/tools/dcr/dcr
if [[ ! -x $dcr ]]; then
  echo "simulate: $dcr was not built (tools/dcr missing, or -Dtools=disabled, or fmt not found)" >&2
  exit 1
fi
exec "$dcr" simulate "$@"
