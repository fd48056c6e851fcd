#!/usr/bin/env bash
# make-test-certs.sh DIR [NAME[:ROLE]...]: a throwaway certificate authority and peer
# certificates for the relay's mutual TLS (tests, `dcr simulate --transport relay`); never for
# production.
#
# Writes DIR/ca.pem (the deployment's CA certificate), DIR/ca.key, and for each NAME (default:
# owner root node) DIR/NAME.pem and DIR/NAME.key: an EC P-256 key and a certificate with
# subject OU=dcr-relay-ROLE, CN=NAME signed by the CA, valid 30 days for both TLS server and
# client use. The OU is the relay role the certificate grants (dcr/protocol/relay/relay_link.hpp):
# ROLE is owner, root or node, by default NAME itself (so NAME must be one of them unless a
# ROLE is given); ROLE `none` issues a certificate that grants no role (tests of refusals).
# Subject alternative names: $DCR_CERT_SAN if set (an openssl subjectAltName value, e.g.
# "DNS:root-1.example"), else IP:127.0.0.1 and DNS:localhost; a client checks that the server's
# certificate names the address it dialed. Check-first: an existing CA or certificate is kept
# if it grants the role asked for (a new NAME is signed by the existing CA; one from before
# roles were bound is reissued), so reruns are cheap and idempotent. Two directories are two
# unrelated CAs: a certificate from one is "wrongly signed" for the other.
# Needs the openssl command-line tool (OpenSSL 1.1.1 or later).
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 DIR [NAME[:ROLE]...]   (default names: owner root node; ROLE owner|root|node|none)" >&2
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
cat >"$extensions" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = ${DCR_CERT_SAN:-IP:127.0.0.1, DNS:localhost}
EOF

for spec in "${names[@]}"; do
  name=${spec%%:*}
  role=${spec#*:}
  [[ $spec == *:* ]] || role=$name
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "make-test-certs: bad name '$name'" >&2; exit 2; }
  case $role in
    owner | root | node) subject="/OU=dcr-relay-$role/CN=$name" ;;
    none) subject="/CN=$name" ;;
    *) echo "make-test-certs: '$spec': the role must be owner, root, node or none (NAME:ROLE)" >&2; exit 2 ;;
  esac
  if [[ -s $dir/$name.pem && -s $dir/$name.key ]]; then
    granted=$(openssl x509 -in "$dir/$name.pem" -noout -subject -nameopt RFC2253 2>/dev/null || true)
    if [[ $role == none ]]; then
      [[ $granted != *OU=dcr-relay-* ]] && continue
    elif [[ $granted == *OU=dcr-relay-$role* ]]; then
      continue
    fi
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subject" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 30 -extfile "$extensions" \
    -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr"
done
chmod 644 "$dir"/*.pem
