#!/usr/bin/env bash
# simulate_s3.sh MODE DCR [ARGS...]: runs `dcr simulate` with its payloads in the S3 server that
# scripts/with-s3.sh started (DCR_S3_ENDPOINT, DCR_S3_BUCKET, AWS_* credentials), under a fresh
# prefix, and checks what MODE says:
#   run          it exits 0 (every step committed once, bit-exact)
#   fanout       --s3-fanout --json: also, on every step, the bytes entering the rollout nodes
#                are at most 1.2 x the payload bytes (each payload crossed once), and without
#                fan-out the same run would have needed one crossing per receiver
#   flows        tests/tool/simulate_flows.py over S3: trainer and rollout nodes on shaped flows
#                with the full-checkpoint reference (its objects in S3 too), the flow accounting
#                adding up
#   https        over the server's https port (DCR_S3_HTTPS_ENDPOINT) with --s3-ca-bundle
#                DCR_S3_CA_FILE, the credentials from a shared credentials file (AWS_PROFILE,
#                AWS_SHARED_CREDENTIALS_FILE) instead of AWS_ACCESS_KEY_ID: it exits 0; with
#                --s3-ca-bundle DCR_S3_OTHER_CA_FILE it exits 1, naming the certificate
#   wrong-secret with a wrong AWS_SECRET_ACCESS_KEY it exits 1 before starting anything, with
#                an error naming the bucket, HTTP 403 and SignatureDoesNotMatch, and leaves no
#                object under the prefix
# Afterwards (every mode) no object of the run is left in the bucket.
set -euo pipefail
mode=$1
dcr=$2
shift 2
: "${DCR_S3_ENDPOINT:?run through scripts/with-s3.sh}"
: "${DCR_S3_BUCKET:?run through scripts/with-s3.sh}"
prefix="simulate-$$-$RANDOM"
url="s3://$DCR_S3_BUCKET/$prefix"
out=$(mktemp "${TMPDIR:-/tmp}/dcr-simulate-s3-XXXXXX")
trap 'rm -f "$out" "$out.err"' EXIT

# The keys under the prefix (one per line), listed with curl's own SigV4.
keys_left() {
  curl -s --aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "$DCR_S3_ENDPOINT/$DCR_S3_BUCKET/?list-type=2&prefix=$prefix%2F" |
    grep -o '<Key>[^<]*</Key>' || true
}

# After a run that wrote its status to $status, its stdout to $out and its stderr to $out.err:
# status 0 when the run exited 1 and its stderr matches the grep pattern $2; otherwise 1, saying
# what was expected ($1) and what happened.
expect_refused() {
  cat "$out.err" >&2
  if ((status != 1)); then
    echo "simulate_s3.sh: expected exit status 1 $1, got $status" >&2
    status=1
  elif ! grep -qi -- "$2" "$out.err"; then
    echo "simulate_s3.sh: the error $1 does not match '$2'" >&2
    status=1
  else
    status=0
  fi
}

status=0
case $mode in
  run)
    "$dcr" simulate --transport "$url" --s3-endpoint "$DCR_S3_ENDPOINT" "$@" || status=$?
    ;;
  fanout)
    "$dcr" simulate --transport "$url" --s3-endpoint "$DCR_S3_ENDPOINT" --s3-fanout --json "$@" \
      >"$out" || status=$?
    if ((status == 0)); then
      python3 - "$out" <<'EOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
ok = report["all_bit_exact"] and report["s3_fanout"]
for step in report["steps"]:
    into_rollout = sum(b for name, b in step["flows"].items() if name.startswith("rollout-node-"))
    ratio = into_rollout / step["payload_bytes"]
    print(f"step {step['step']}: {step['payload_bytes']} payload bytes, {into_rollout} entered the "
          f"rollout cluster ({ratio:.3f}x) over {sum(1 for n in step['flows'] if n.startswith('rollout-node-'))} flows")
    if ratio > 1.2:
        print("  more than 1.2x the payload bytes crossed into the rollout cluster", file=sys.stderr)
        ok = False
sys.exit(0 if ok else 1)
EOF
    fi
    ;;
  flows)
    python3 "$(dirname "${BASH_SOURCE[0]}")/../tool/simulate_flows.py" "$dcr" --transport "$url" \
      --s3-endpoint "$DCR_S3_ENDPOINT" "$@" || status=$?
    ;;
  https)
    : "${DCR_S3_HTTPS_ENDPOINT:?run through scripts/with-s3.sh}"
    creds=$(mktemp "${TMPDIR:-/tmp}/dcr-simulate-s3-creds-XXXXXX")
    printf '[other]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n[dcr]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
      "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$creds"
    https_run() {
      env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_SHARED_CREDENTIALS_FILE="$creds" \
        AWS_PROFILE=dcr "$dcr" simulate --transport "$url" --s3-endpoint "$DCR_S3_HTTPS_ENDPOINT" "$@"
    }
    https_run --s3-ca-bundle "$DCR_S3_CA_FILE" "$@" || status=$?
    if ((status == 0)); then
      https_run --s3-ca-bundle "$DCR_S3_OTHER_CA_FILE" "$@" >"$out" 2>"$out.err" || status=$?
      expect_refused "under a CA that did not sign the server" "certificate"
    fi
    rm -f "$creds"
    ;;
  wrong-secret)
    AWS_SECRET_ACCESS_KEY="wrong-$AWS_SECRET_ACCESS_KEY" \
      "$dcr" simulate --transport "$url" --s3-endpoint "$DCR_S3_ENDPOINT" "$@" >"$out" 2>"$out.err" ||
      status=$?
    expect_refused "with a wrong secret" "s3://$DCR_S3_BUCKET/$prefix/.*HTTP 403 SignatureDoesNotMatch"
    if ((status == 0)) && grep -q "processes" "$out"; then
      echo "simulate_s3.sh: agents were started although S3 refused the credentials" >&2
      status=1
    fi
    ;;
  *)
    echo "usage: simulate_s3.sh run|fanout|flows|https|wrong-secret DCR [ARGS...]" >&2
    exit 2
    ;;
esac
left=$(keys_left)
if [[ -n $left ]]; then
  echo "simulate_s3.sh: objects left under s3://$DCR_S3_BUCKET/$prefix/:" >&2
  echo "$left" | head -n 10 >&2
  status=1
fi
exit "$status"
