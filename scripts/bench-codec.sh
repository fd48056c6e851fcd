#!/usr/bin/env bash
# bench-codec.sh: the codec figures of docs/benchmarks.md. Installs, builds (scripts/build.sh),
# then runs benchmarks/codec_report at full size: the paper's Table 2 protocol (20,000,000
# values), the stress protocol on 256 Mi BF16 elements at 1%, 3% and 5% beside the paper's coding,
# int32+overwrite, dense xor, `zstd --patch-from` and `xdelta3`, and one-core throughput beside a
# plain compare loop. Markdown on stdout, progress and build output on stderr; extra arguments go
# to codec_report (e.g. --elements 16Mi for a quick run, --json, --help). Needs about 3.5 GB of
# memory and 1.1 GB under /tmp (removed at exit); run it on a quiet machine, since the
# throughput figures are one-core timings.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/build.sh >&2

report=build/benchmarks/codec_report
if [[ ! -x $report ]]; then
  echo "bench-codec: $report was not built (Google Benchmark not found, or -Dbenchmarks=disabled)" >&2
  exit 1
fi
exec "$report" "$@"
