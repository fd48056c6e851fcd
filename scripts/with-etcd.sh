#!/usr/bin/env bash
# with-etcd.sh [--tls] CMD...: runs CMD beside a throwaway single-member etcd (Debian's
# etcd-server, /usr/bin/etcd) for the etcd control-plane tests.
#
# etcd listens on 127.0.0.1 only, on the first free pair of ports from 23790 upward (client,
# then peer), with a temporary data directory. Once it answers /health (10 s at most) CMD runs
# with these in its environment:
#   DCR_ETCD_ENDPOINT  the client URL, e.g. http://127.0.0.1:23790
#   DCR_ETCD_PID       etcd's process id (tests freeze it with SIGSTOP to simulate an outage)
# With --tls, etcd serves https only and requires client certificates (--cert-file, --key-file,
# --client-cert-auth, --trusted-ca-file; certificates made by openssl in the temporary
# directory: a CA, etcd's certificate for 127.0.0.1 and localhost, a client certificate, and a
# client certificate from another CA), and authentication is enabled (etcdctl: users root and
# dcr-test, the latter with read-write access to keys under "/"; simple tokens living 2 s
# without use, --auth-token-ttl, so that clients must renew them; --bcrypt-cost 4). Then also:
#   DCR_ETCD_ENDPOINT  https://127.0.0.1:PORT
#   DCR_ETCD_CA        the CA's PEM certificate
#   DCR_ETCD_CERT, DCR_ETCD_KEY              a client certificate and key signed by that CA
#   DCR_ETCD_WRONG_CERT, DCR_ETCD_WRONG_KEY  a client certificate and key from another CA
#   DCR_ETCD_USER, DCR_ETCD_PASSWORD         dcr-test and its password (drawn for this run)
# Afterwards, also when CMD fails or the script is interrupted, etcd is resumed (a test may have
# left it frozen), stopped (SIGTERM, then SIGKILL after 5 s) and its data directory removed.
# Exits with CMD's status; with a message and 1 if etcd does not come up, or is not installed
# (then 77, meson's "skipped", unless CI is set). ETCD_BIN overrides the etcd binary.
set -euo pipefail

tls=false
if [[ ${1:-} == --tls ]]; then
  tls=true
  shift
fi
if (($# == 0)); then
  echo "usage: with-etcd.sh [--tls] CMD [ARG...]" >&2
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

scheme=http
tls_flags=()
curl_tls=()
if $tls; then
  for tool in openssl curl "${ETCDCTL_BIN:-etcdctl}"; do
    if ! command -v "$tool" >/dev/null; then
      echo "with-etcd.sh: --tls needs $tool" >&2
      exit 1
    fi
  done
  t=$data_dir/tls
  mkdir -p "$t"
  # new_cert NAME CA SUBJECT EXT: NAME.pem/NAME.key signed by CA.pem/CA.key.
  new_cert() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$t/$1.key" \
      -out "$t/$1.csr" -subj "$3" 2>/dev/null
    printf '%s\n' "$4" >"$t/$1.ext"
    openssl x509 -req -in "$t/$1.csr" -CA "$t/$2.pem" -CAkey "$t/$2.key" -CAcreateserial \
      -days 2 -extfile "$t/$1.ext" -out "$t/$1.pem" 2>/dev/null
  }
  {
    for ca in ca other-ca; do
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -keyout "$t/$ca.key" -out "$t/$ca.pem" -subj "/CN=dcr etcd test $ca" 2>/dev/null
    done
    # etcd's own certificate also serves its gateway as a client of its gRPC port.
    new_cert server ca /CN=etcd-server "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth"
    # No CommonName: etcd's gateway refuses client certificates that carry one (it would not
    # use it as the user), so the user comes from authentication.
    new_cert client ca /O=dcr-client "extendedKeyUsage=clientAuth"
    new_cert wrong other-ca /O=dcr-client "extendedKeyUsage=clientAuth"
  } || { echo "with-etcd.sh: openssl could not make the certificates" >&2; exit 1; }
  scheme=https
  # --bcrypt-cost 4 (etcd's default is 10): the test's password needs no strength, and many
  # processes authenticating at once on a loaded machine would otherwise queue for seconds.
  tls_flags=(--cert-file "$t/server.pem" --key-file "$t/server.key" --client-cert-auth
             --trusted-ca-file "$t/ca.pem" --auth-token-ttl 2 --bcrypt-cost 4)
  curl_tls=(--cacert "$t/ca.pem" --cert "$t/client.pem" --key "$t/client.key")
fi

# True once etcd's /health says so.
healthy() {
  local reply
  if $tls; then
    reply=$(curl -s -m 1 "${curl_tls[@]}" "https://127.0.0.1:$1/health" 2>/dev/null) || return 1
  elif command -v curl >/dev/null; then
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
    --listen-client-urls "$scheme://127.0.0.1:$client" \
    --advertise-client-urls "$scheme://127.0.0.1:$client" \
    "${tls_flags[@]}" \
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

if $tls; then
  # Users and roles, then authentication on (etcdctl speaks gRPC with the client certificate).
  password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
  root_password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
  ctl() {
    ETCDCTL_API=3 "${ETCDCTL_BIN:-etcdctl}" --endpoints "https://127.0.0.1:$client" \
      --cacert "$t/ca.pem" --cert "$t/client.pem" --key "$t/client.key" "$@" >>"$data_dir/etcdctl.log" 2>&1
  }
  if ! { ctl user add "root:$root_password" && ctl role add root && ctl user grant-role root root &&
         ctl role add dcr-rw && ctl role grant-permission dcr-rw --prefix=true readwrite / &&
         ctl user add "dcr-test:$password" && ctl user grant-role dcr-test dcr-rw &&
         ctl auth enable; }; then
    echo "with-etcd.sh: could not set up etcd's users; etcdctl said:" >&2
    cat "$data_dir/etcdctl.log" >&2
    exit 1
  fi
  export DCR_ETCD_CA="$t/ca.pem"
  export DCR_ETCD_CERT="$t/client.pem" DCR_ETCD_KEY="$t/client.key"
  export DCR_ETCD_WRONG_CERT="$t/wrong.pem" DCR_ETCD_WRONG_KEY="$t/wrong.key"
  export DCR_ETCD_USER=dcr-test DCR_ETCD_PASSWORD="$password"
fi
export DCR_ETCD_ENDPOINT="$scheme://127.0.0.1:$client"
export DCR_ETCD_PID="$etcd_pid"
run_beside_server "$@"
