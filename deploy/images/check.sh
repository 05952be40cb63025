#!/usr/bin/env bash
# Runs Loom from the images' root file systems (made by deploy/images/build.sh) and trains the
# demo job (examples/demo.yaml) to SUCCEEDED: loomd from the loomd image, one loom-worker (and
# its loom-train ranks) from the worker image, each under `chroot` as the images' non-root user
# (uid 10001), with TLS and tokens from scripts/dev-certs.sh placed where the Kubernetes
# manifests put them (/run/loom/secrets). loomctl and the probe run from the loomd image too.
# `chroot`, not a container runtime: podman does not run in this sandbox (see
# docs/operator-guide.md, "Images"); the root file systems are exactly the images' layers.
#
# Usage: deploy/images/check.sh [IMAGES_DIR]   (default .cache/images; needs root)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/.cache/images}"
d="$out/rootfs/loomd"
w="$out/rootfs/loom-worker"
die() { echo "check: FAIL: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (chroot)"
[[ -x $d/opt/loom/bin/loomd && -x $w/opt/loom/bin/loom-worker ]] ||
  die "no root file systems in $out/rootfs: run deploy/images/build.sh first"

start=$(date +%s)
mounted=()
pids=()
cleanup() {
  local p m
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for m in "${mounted[@]}"; do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
for fs in "$d" "$w"; do
  mount -t proc proc "$fs/proc" && mounted+=("$fs/proc")
  mount --rbind /dev "$fs/dev" && mounted+=("$fs/dev")
  rm -rf "$fs/var/lib/loom/"{state,work,checkpoints} "$fs/tmp/"*
  install -d -o 10001 -g 10001 "$fs/var/lib/loom/checkpoints" "$fs/run/loom/secrets"
done
as_loom() {  # as_loom ROOTFS CMD...: CMD inside ROOTFS as the image's user
  local fs=$1
  shift
  chroot --userspec=10001:10001 "$fs" env HOME=/var/lib/loom "$@"
}

# Certificates and tokens: loomd's certificate names loomd.loom.svc (as on Kubernetes) and
# 127.0.0.1 (here).
certs=$(mktemp -d)
bash "$root/scripts/dev-certs.sh" "$certs" DNS:loomd.loom.svc IP:127.0.0.1 >/dev/null
put() { install -m 600 -o 10001 -g 10001 "$certs/$2" "$1/run/loom/secrets/$3"; }
put "$d" loomd.pem tls.crt && put "$d" loomd.key tls.key && put "$d" ca.pem ca.crt
put "$d" tokens tokens && put "$d" user.token user.token
put "$w" ca.pem ca.crt && put "$w" node.token node.token
rm -rf "$certs"

echo "check: loomd (loomd image)"
as_loom "$d" /opt/loom/bin/loomd --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --state-dir=/var/lib/loom/state --ready-file=/var/lib/loom/loomd.ready \
  --tls-cert=/run/loom/secrets/tls.crt --tls-key=/run/loom/secrets/tls.key \
  --tls-client-ca=/run/loom/secrets/ca.crt --tokens-file=/run/loom/secrets/tokens \
  --checkpoint-roots=/var/lib/loom/checkpoints >"$out/check-loomd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $d/var/lib/loom/loomd.ready ]] && break; sleep 0.2; done
[[ -s $d/var/lib/loom/loomd.ready ]] || { cat "$out/check-loomd.log"; die "loomd did not start"; }
server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' \
  "$d/var/lib/loom/loomd.ready")

echo "check: loom-health-probe against loomd (the Kubernetes probe)"
as_loom "$d" /opt/loom/bin/loom-health-probe --addr="$server" --ca=/run/loom/secrets/ca.crt \
  --server-name=loomd.loom.svc || die "the health probe failed against a serving loomd"
if as_loom "$d" /opt/loom/bin/loom-health-probe --addr="$server" --ca=/run/loom/secrets/ca.crt \
  --server-name=not-loomd.example 2>/dev/null; then
  die "the health probe passed with a name the certificate does not carry"
fi

echo "check: loom-worker and loom-train (worker image)"
as_loom "$w" /opt/loom/bin/loom-worker --coordinator="$server" --name=image-check \
  --cpu-devices=1 --work-dir=/var/lib/loom/work --checkpoint-roots=/var/lib/loom/checkpoints \
  --tls-ca=/run/loom/secrets/ca.crt --join-token-file=/run/loom/secrets/node.token \
  --ready-file=/var/lib/loom/worker.ready >"$out/check-worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 150); do [[ -s $w/var/lib/loom/worker.ready ]] && break; sleep 0.2; done
[[ -s $w/var/lib/loom/worker.ready ]] || { cat "$out/check-worker.log"; die "the worker did not start"; }

echo "check: the demo job (examples/demo.yaml), submitted with loomctl from the loomd image"
install -m 644 "$root/examples/demo.yaml" "$d/tmp/demo.yaml"
ctl() {
  as_loom "$d" env LOOM_SERVER="$server" LOOM_TLS_CA=/run/loom/secrets/ca.crt \
    LOOM_TOKEN_FILE=/run/loom/secrets/user.token /opt/loom/bin/loomctl "$@"
}
job=$(ctl submit -f /tmp/demo.yaml -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
echo "check: submitted $job"
timeout 600 bash -c "$(declare -f as_loom ctl); d='$d' server='$server'; ctl watch '$job'" \
  >"$out/check-watch.log" 2>&1 || true
tail -n 2 "$out/check-watch.log"
state=$(ctl get "$job" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
ctl logs "$job" | tail -n 3 || true
if [[ $state != SUCCEEDED && $state != JOB_STATE_SUCCEEDED ]]; then
  tail -n 30 "$out/check-loomd.log" "$out/check-worker.log"
  die "$job ended $state"
fi
echo "check: PASS: $job $state, from the images' root file systems in $(($(date +%s) - start)) s"
