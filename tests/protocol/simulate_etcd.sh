#!/usr/bin/env bash
# simulate_etcd.sh DCR [ARGS...]: runs `dcr simulate` with its control plane in the etcd that
# scripts/with-etcd.sh started (DCR_ETCD_ENDPOINT, DCR_ETCD_PID), under a fresh key prefix.
# Under with-etcd.sh --tls (DCR_ETCD_CA set) the address is etcds:// with the CA, the client
# certificate and the user (its password through DCR_ETCD_PASSWORD, which every process of the
# run inherits).
set -euo pipefail
dcr=$1
shift
: "${DCR_ETCD_ENDPOINT:?run through scripts/with-etcd.sh}"
if [[ -n ${DCR_ETCD_CA:-} ]]; then
  hostport=${DCR_ETCD_ENDPOINT#https://}
  exec "$dcr" simulate --commit "etcds://${hostport}/dcr-test-$$?ca=$DCR_ETCD_CA&cert=$DCR_ETCD_CERT&key=$DCR_ETCD_KEY&user=$DCR_ETCD_USER" "$@"
fi
hostport=${DCR_ETCD_ENDPOINT#http://}
exec "$dcr" simulate --commit "etcd://${hostport}/dcr-test-$$" "$@"
