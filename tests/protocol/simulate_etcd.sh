#!/usr/bin/env bash
# simulate_etcd.sh DCR [ARGS...]: runs `dcr simulate` with its control plane in the etcd that
# scripts/with-etcd.sh started (DCR_ETCD_ENDPOINT, DCR_ETCD_PID), under a fresh key prefix.
set -euo pipefail
dcr=$1
shift
: "${DCR_ETCD_ENDPOINT:?run through scripts/with-etcd.sh}"
hostport=${DCR_ETCD_ENDPOINT#http://}
exec "$dcr" simulate --commit "etcd://${hostport}/dcr-test-$$" "$@"
