#!/usr/bin/env bash
# simulate_relay_refused.sh DCR MAKE_TEST_CERTS: `dcr simulate --transport relay` whose owners
# present certificates signed by another CA. Every root must refuse them at the handshake,
# naming the owner's address, the run must fail, and nothing may be committed.
set -euo pipefail
dcr=$1
make_certs=$2
dir=$(mktemp -d /tmp/dcr-relay-refused-XXXXXX)
trap 'rm -rf "$dir"' EXIT
bash "$make_certs" "$dir/deployment" owner root node
bash "$make_certs" "$dir/rogue" owner
cp "$dir/rogue/owner.pem" "$dir/rogue/owner.key" "$dir/deployment/"  # the owners' certificates: wrong CA
status=0
"$dcr" simulate --transport relay --relay-roots 2 --relay-certs "$dir/deployment" --size 4M \
  --steps 1 --timeout 15 --json >"$dir/report.json" 2>"$dir/stderr" || status=$?
if [[ $status -eq 0 ]]; then
  echo "simulate_relay_refused: the run succeeded with wrongly signed owners" >&2
  exit 1
fi
grep -q 'refused peer 127.0.0.1:' "$dir/stderr" || {
  echo "simulate_relay_refused: no refusal naming the peer on stderr:" >&2
  cat "$dir/stderr" >&2
  exit 1
}
python3 - "$dir/report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
committed = [s["step"] for s in report["steps"] if s["committed"]]
assert not committed, f"steps {committed} committed with wrongly signed owners"
assert not report["all_bit_exact"]
refusals = sum(r["refusals"] for r in report["relay"]["root_counters"])
assert refusals > 0, "the roots counted no refusal"
failures = [f for s in report["steps"] for f in s["failures"]]
print(f"simulate_relay_refused: nothing committed, {refusals} refusals at the roots")
PY
