#!/usr/bin/env bash
# make-test-certs.sh DIR [NAME...]: a throwaway certificate authority and peer certificates for
# the relay's mutual TLS (tests, `dcr simulate --transport relay`); never for production.
#
# Writes DIR/ca.pem (the deployment's CA certificate), DIR/ca.key, and for each NAME (default:
# owner root node) DIR/NAME.pem and DIR/NAME.key: an EC P-256 key and a certificate with
# CN=NAME signed by the CA, valid 30 days for both TLS server and client use, with subject
# alternative names IP:127.0.0.1 and DNS:localhost. Check-first: an existing CA or certificate
# is kept (a new NAME is signed by the existing CA), so reruns are cheap and idempotent. Two
# directories are two unrelated CAs: a certificate from one is "wrongly signed" for the other.
# Needs the openssl command-line tool (OpenSSL 1.1.1 or later).
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 DIR [NAME...]   (default names: owner root node)" >&2
  exit 2
fi
dir=$1
shift
names=("$@")
((${#names[@]})) || names=(owner root node)
command -v openssl >/dev/null || { echo "make-test-certs: the openssl command is not installed" >&2; exit 1; }
mkdir -p "$dir"
umask 077

if [[ ! -s $dir/ca.pem || ! -s $dir/ca.key ]]; then
  # A distinct subject per CA, so that two throwaway CAs are never mistaken for one another.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=dcr throwaway test CA $(openssl rand -hex 6)" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi

extensions=$(mktemp)
trap 'rm -f "$extensions"' EXIT
cat >"$extensions" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
EOF

for name in "${names[@]}"; do
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "make-test-certs: bad name '$name'" >&2; exit 2; }
  [[ -s $dir/$name.pem && -s $dir/$name.key ]] && continue
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 30 -extfile "$extensions" \
    -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr"
done
chmod 644 "$dir"/*.pem
