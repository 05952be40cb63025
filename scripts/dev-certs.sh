#!/usr/bin/env bash
# Makes a development certificate authority, certificates and tokens for a Loom cluster, with
# openssl (Debian's package). For development and tests only: production certificates come from
# your own CA.
#
#   scripts/dev-certs.sh DIR [SAN ...]
#
# SANs name the addresses loomd is reached at (default: DNS:localhost IP:127.0.0.1 IP:::1); give
# e.g. IP:10.0.0.5 DNS:loomd.example for a cluster. Writes into DIR (created, mode 700):
#   ca.pem ca.key          the CA (keep ca.key private)
#   loomd.pem loomd.key    loomd's serving certificate (--tls-cert/--tls-key)
#   tokens                 loomd's --tokens-file: user tenant "dev", admin tenant "ops", and a
#                          node join token for any node id
#   user.token admin.token node.token   the same tokens, one per file (mode 600), for
#                          loomctl --token-file / LOOM_TOKEN_FILE and loom-worker --join-token-file
#   ROLE-NAME.pem/.key     client certificates named ROLE:NAME for each ROLE:NAME listed in
#                          $LOOM_DEV_CLIENTS (e.g. "node:worker-0 user:team-b"): mutual TLS
# The CA and loomd's certificate are world-readable (ranks running as an unprivileged user read the
# CA to verify loomd); keys and tokens are not.
# Existing files are kept, so running it again is harmless.
set -euo pipefail
dir=${1:?usage: scripts/dev-certs.sh DIR [SAN ...]}
shift
sans=("$@")
[[ ${#sans[@]} -gt 0 ]] || sans=(DNS:localhost IP:127.0.0.1 IP:::1)
command -v openssl >/dev/null || { echo "dev-certs: openssl is not installed (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$dir"
chmod 711 "$dir"
cd "$dir"
umask 077

if [[ ! -f ca.pem ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=Loom development CA" -keyout ca.key -out ca.pem 2>/dev/null
fi

# issue NAME CN [SAN...]: a leaf certificate signed by the CA.
issue() {
  local name=$1 cn=$2
  shift 2
  [[ -f $name.pem ]] && return 0
  local ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth"
  if [[ $# -gt 0 ]]; then
    ext+=$'\n'"subjectAltName=$(IFS=,; echo "$*")"
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
    -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile <(printf '%s\n' "$ext") -out "$name.pem" 2>/dev/null
  rm -f "$name.csr"
}
issue loomd loomd "${sans[@]}"
for client in ${LOOM_DEV_CLIENTS:-}; do issue "${client/:/-}" "$client"; done
chmod 644 ca.pem loomd.pem

if [[ ! -f tokens ]]; then
  for who in user admin node; do openssl rand -hex 32 >"$who.token"; done
  {
    echo "# role  subject  token   (loomd --tokens-file; see server/auth/token_table.h)"
    echo "user  dev  $(cat user.token)"
    echo "admin ops  $(cat admin.token)"
    echo "node  *    $(cat node.token)"
  } >tokens
fi
echo "dev-certs: CA, loomd certificate and tokens in $dir"
