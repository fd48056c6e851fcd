#!/usr/bin/env bash
# with-etcd.sh CMD...: runs CMD beside a throwaway single-member etcd (Debian's etcd-server,
# /usr/bin/etcd) for the etcd control-plane tests.
#
# etcd listens on 127.0.0.1 only, on the first free pair of ports from 23790 upward (client,
# then peer), with a temporary data directory. Once it answers /health (10 s at most) CMD runs
# with these in its environment:
#   DCR_ETCD_ENDPOINT  the client URL, e.g. http://127.0.0.1:23790
#   DCR_ETCD_PID       etcd's process id (tests freeze it with SIGSTOP to simulate an outage)
# Afterwards, also when CMD fails or the script is interrupted, etcd is resumed (a test may have
# left it frozen), stopped (SIGTERM, then SIGKILL after 5 s) and its data directory removed.
# Exits with CMD's status; with a message and 1 if etcd does not come up, or is not installed
# (then 77, meson's "skipped", unless CI is set). ETCD_BIN overrides the etcd binary.
set -euo pipefail

if (($# == 0)); then
  echo "usage: with-etcd.sh CMD [ARG...]" >&2
  exit 2
fi
etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
if [[ -z $etcd_bin || ! -x $etcd_bin ]]; then
  echo "with-etcd.sh: etcd is not installed (Debian: apt-get install etcd-server;" \
       "or run scripts/install-deps.sh)" >&2
  # 77 is meson's "skipped": a developer without etcd skips; CI must have it.
  if [[ -n ${CI:-} ]]; then exit 1; else exit 77; fi
fi

data_dir=$(mktemp -d "${TMPDIR:-/tmp}/dcr-etcd-XXXXXX")
etcd_pid=""

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n $etcd_pid ]] && kill -0 "$etcd_pid" 2>/dev/null; then
    kill -CONT "$etcd_pid" 2>/dev/null || true
    kill -TERM "$etcd_pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$etcd_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
  fi
  rm -rf "$data_dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=scripts/server-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-common.sh"

# True once etcd's /health says so.
healthy() {
  local reply
  if command -v curl >/dev/null; then
    reply=$(curl -s -m 1 "http://127.0.0.1:$1/health" 2>/dev/null) || return 1
  else
    # shellcheck disable=SC2016  # $0 expands in the inner bash
    reply=$(timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" &&
                              printf "GET /health HTTP/1.0\r\n\r\n" >&3 && cat <&3' "$1" \
            2>/dev/null) || return 1
  fi
  [[ $reply == *'"health":"true"'* ]]
}

# Tries port pairs until etcd binds both and turns healthy (a port may be taken between the
# check and etcd's bind; etcd then exits and the next pair is tried).
port=23790
started=false
for _attempt in 1 2 3 4 5; do
  while port_in_use "$port" || port_in_use "$((port + 1))"; do port=$((port + 2)); done
  client=$port peer=$((port + 1))
  rm -rf "$data_dir/data"
  "$etcd_bin" --name dcr-test --data-dir "$data_dir/data" \
    --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "dcr-test=http://127.0.0.1:$peer" \
    --initial-cluster-state new \
    --logger zap --log-outputs stderr --log-level warn \
    >"$data_dir/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do  # 10 s
    if ! kill -0 "$etcd_pid" 2>/dev/null; then break; fi
    if healthy "$client"; then started=true; break; fi
    sleep 0.1
  done
  if $started; then break; fi
  if kill -0 "$etcd_pid" 2>/dev/null; then  # running but never healthy: give up
    echo "with-etcd.sh: etcd did not become healthy on port $client within 10 s; its log:" >&2
    cat "$data_dir/etcd.log" >&2
    exit 1
  fi
  wait "$etcd_pid" 2>/dev/null || true
  etcd_pid=""
  port=$((port + 2))
done
if ! $started; then
  echo "with-etcd.sh: etcd failed to start; its last log:" >&2
  cat "$data_dir/etcd.log" >&2
  exit 1
fi

export DCR_ETCD_ENDPOINT="http://127.0.0.1:$client"
export DCR_ETCD_PID="$etcd_pid"
run_beside_server "$@"
