#!/usr/bin/env bash
# Runs Loom from the images built by deploy/images/build.sh and trains the demo job
# (examples/demo.yaml) to SUCCEEDED: loomd from the loomd image, one loom-worker (and its
# loom-train ranks) from the worker image, as the images' non-root user (uid 10001), with TLS and
# tokens from scripts/dev-certs.sh where the Kubernetes manifests put them (/run/loom/secrets).
# loomctl and the health probe run inside the loomd container, as the kubelet's exec probe does.
#
# Usage: deploy/images/check.sh [--podman] [IMAGES_DIR]   (default .cache/images; needs root)
#   default   `chroot` into the root file systems (IMAGES_DIR/rootfs): the images' layers, not
#             their OCI configuration
#   --podman  the OCI images themselves (IMAGES_DIR/oci) under podman with runc, read-only root
#             file systems, host network: the entry point and user of the image configuration
#             too. podman and runc are Debian's (scripts/setup.sh --images); podman's default
#             ulimits are dropped (a sandbox may not allow raising them) and runc is used
#             (crun refuses a hybrid cgroup hierarchy).
#   --manifests the same images, but run as the pods of the rendered deploy/k8s dev overlay
#             (deploy/images/run_pods.py: init containers, users, capabilities, volumes, probes,
#             the manifests' own commands and flags); Services resolve to 127.0.0.1. Uses the
#             fixed ports of the manifests (7070 to 7073).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/deploy/images/images.env"
mode=chroot
if [[ ${1:-} == --podman || ${1:-} == --manifests ]]; then
  mode=${1#--}
  shift
fi
out="${1:-$root/.cache/images}"
die() { echo "check: FAIL: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root"

start=$(date +%s)
tmp=$(mktemp -d)
mounted=()
pids=()
containers=()
cleanup() {
  local p m i
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for m in "${containers[@]}"; do podman rm -f -t 5 "$m" >/dev/null 2>&1 || true; done
  for p in "${pids[@]}"; do  # the worker stops its ranks first
    for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  for m in "${mounted[@]}"; do
    umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# manifests: the dev overlay's pods, run by run_pods.py, then the demo job through them.
manifests() {
  local certs=$tmp/certs secrets=$tmp/secrets
  bash "$root/scripts/dev-certs.sh" "$certs" DNS:loomd.loom.svc IP:127.0.0.1 >/dev/null
  mkdir -p "$secrets"/{loomd-tls,loomd-tokens,loom-worker}
  cp "$certs/loomd.pem" "$secrets/loomd-tls/tls.crt"
  cp "$certs/loomd.key" "$secrets/loomd-tls/tls.key"
  cp "$certs/ca.pem" "$secrets/loomd-tls/ca.crt"
  cp "$certs/tokens" "$secrets/loomd-tokens/tokens"
  cp "$certs/ca.pem" "$secrets/loom-worker/ca.crt"
  cp "$certs/node.token" "$secrets/loom-worker/node.token"
  kubectl kustomize "$root/deploy/k8s/overlays/dev" >"$tmp/dev.yaml" 2>/dev/null
  local map="$LOOMD_IMAGE:$LOOM_IMAGE_TAG=check-loomd:$LOOM_IMAGE_TAG"
  map+=",$LOOM_WORKER_IMAGE:$LOOM_IMAGE_TAG=check-loom-worker:$LOOM_IMAGE_TAG"
  containers+=(pods-loomd-loomd pods-loom-worker-loom-worker)
  echo "check (manifests): the dev overlay's loomd and loom-worker pods, with their probes"
  python3 "$root/deploy/images/run_pods.py" "$tmp/dev.yaml" "$tmp/pods" "$map" "$secrets" \
    >/dev/null || die "the pods did not start (run_pods.py above)"
  pod logs pods-loomd-loomd >"$out/check-loomd.log" 2>&1 || true
  install -m 644 "$root/examples/demo.yaml" "$tmp/pods/loomd/state/demo.yaml"
  local user_token
  user_token=$(cat "$certs/user.token")
  mctl() {
    pod exec -e LOOM_SERVER=loomd.loom.svc:7070 -e LOOM_TLS_CA=/run/loom/secrets/ca.crt \
      -e LOOM_TOKEN="$user_token" pods-loomd-loomd /opt/loom/bin/loomctl "$@"
  }
  # The worker's health port serves before it has registered (it measures its devices first).
  local i
  for ((i = 0; i < 60; i++)); do
    mctl nodes -o json 2>/dev/null | grep -q '"READY"\|NODE_STATE_READY\|"ready"' && break
    sleep 1
  done
  echo "check (manifests): the demo job, submitted with loomctl inside the loomd pod"
  local job state
  job=$(mctl submit -f /var/lib/loom/state/demo.yaml -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
  timeout 600 podman --runtime runc exec -e LOOM_SERVER=loomd.loom.svc:7070 \
    -e LOOM_TLS_CA=/run/loom/secrets/ca.crt -e LOOM_TOKEN="$user_token" pods-loomd-loomd \
    /opt/loom/bin/loomctl watch "$job" >"$out/check-watch.log" 2>&1 || true
  tail -n 1 "$out/check-watch.log"
  state=$(mctl get "$job" -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  if [[ $state != SUCCEEDED && $state != JOB_STATE_SUCCEEDED ]]; then
    pod logs pods-loom-worker-loom-worker 2>&1 | tail -n 30
    die "$job ended $state"
  fi
  echo "check (manifests): PASS: $job $state, in the dev overlay's pods," \
    "in $(($(date +%s) - start)) s"
}

if [[ $mode == chroot ]]; then
  d="$out/rootfs/loomd"
  w="$out/rootfs/loom-worker"
  [[ -x $d/opt/loom/bin/loomd && -x $w/opt/loom/bin/loom-worker ]] ||
    die "no root file systems in $out/rootfs: run deploy/images/build.sh first"
  for fs in "$d" "$w"; do
    mount -t proc proc "$fs/proc" && mounted+=("$fs/proc")
    mount --rbind /dev "$fs/dev" && mounted+=("$fs/dev")
    rm -rf "$fs/var/lib/loom/"{state,work,checkpoints} "$fs/tmp/"*
  done
  # Where each container path is on this host.
  d_secrets=$d/run/loom/secrets d_state=$d/var/lib/loom/state
  w_secrets=$w/run/loom/secrets w_work=$w/var/lib/loom/work w_ckpt=$w/var/lib/loom/checkpoints
else
  command -v podman >/dev/null && command -v runc >/dev/null ||
    die "podman and runc are missing: scripts/setup.sh --images"
  printf '[containers]\ndefault_ulimits = []\n' >"$tmp/containers.conf"
  export CONTAINERS_CONF=$tmp/containers.conf
  pod() { podman --runtime runc "$@"; }
  # An OCI layout's path must read as an image reference; an archive of it has no such limit.
  tar -C "$out/oci" -cf "$tmp/oci.tar" .
  for name in loomd loom-worker; do
    pod pull -q "oci-archive:$tmp/oci.tar:$name-$LOOM_IMAGE_TAG" >/dev/null
    pod tag "localhost/$name-$LOOM_IMAGE_TAG" "check-$name:$LOOM_IMAGE_TAG"
  done
  if [[ $mode == manifests ]]; then
    manifests
    exit 0
  fi
  d_secrets=$tmp/d-secrets d_state=$tmp/d-state
  w_secrets=$tmp/w-secrets w_work=$tmp/w-work w_ckpt=$tmp/w-ckpt
fi
install -d -o 10001 -g 10001 "$d_secrets" "$d_state" "$w_secrets" "$w_work" "$w_ckpt"

# start ROLE LOG ARGS...: the role's program (the image's entry point) in the background.
start() {
  local role=$1 log=$2
  shift 2
  if [[ $mode == chroot ]]; then
    local fs=$d
    [[ $role == loomd ]] || fs=$w
    chroot --userspec=10001:10001 "$fs" env HOME=/var/lib/loom "/opt/loom/bin/$role" "$@" \
      >"$log" 2>&1 &
    pids+=($!)
  else
    local mounts=(-v "$d_secrets:/run/loom/secrets:ro" -v "$d_state:/var/lib/loom/state")
    if [[ $role == loom-worker ]]; then
      mounts=(-v "$w_secrets:/run/loom/secrets:ro" -v "$w_work:/var/lib/loom/work"
              -v "$w_ckpt:/var/lib/loom/checkpoints" --shm-size=256m)
    fi
    containers+=("check-$role")
    pod run -d --name "check-$role" --network=host --read-only --read-only-tmpfs=false \
      --tmpfs /tmp "${mounts[@]}" "check-$role:$LOOM_IMAGE_TAG" "$@" >/dev/null
    (pod logs -f "check-$role" >"$log" 2>&1 &)
  fi
}
# in_loomd CMD...: CMD inside the loomd container, as its user.
in_loomd() {
  if [[ $mode == chroot ]]; then
    chroot --userspec=10001:10001 "$d" env HOME=/var/lib/loom "$@"
  else
    pod exec check-loomd "$@"
  fi
}
wait_file() {  # wait_file PATH SECONDS
  local i
  for ((i = 0; i < $2 * 5; i++)); do [[ -s $1 ]] && return 0; sleep 0.2; done
  return 1
}

# Certificates and tokens: loomd's certificate names loomd.loom.svc (as on Kubernetes) and
# 127.0.0.1 (here).
bash "$root/scripts/dev-certs.sh" "$tmp/certs" DNS:loomd.loom.svc IP:127.0.0.1 >/dev/null
put() { install -m 600 -o 10001 -g 10001 "$tmp/certs/$2" "$1/$3"; }
put "$d_secrets" loomd.pem tls.crt && put "$d_secrets" loomd.key tls.key
put "$d_secrets" ca.pem ca.crt && put "$d_secrets" tokens tokens
put "$d_secrets" user.token user.token
put "$w_secrets" ca.pem ca.crt && put "$w_secrets" node.token node.token
install -m 644 -o 10001 -g 10001 "$root/examples/demo.yaml" "$d_state/demo.yaml"

echo "check ($mode): loomd (loomd image)"
start loomd "$out/check-loomd.log" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --state-dir=/var/lib/loom/state --ready-file=/var/lib/loom/state/loomd.ready \
  --tls-cert=/run/loom/secrets/tls.crt --tls-key=/run/loom/secrets/tls.key \
  --tls-client-ca=/run/loom/secrets/ca.crt --tokens-file=/run/loom/secrets/tokens \
  --checkpoint-roots=/var/lib/loom/checkpoints
wait_file "$d_state/loomd.ready" 30 || { cat "$out/check-loomd.log"; die "loomd did not start"; }
server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["grpc"])' \
  "$d_state/loomd.ready")

echo "check ($mode): loom-health-probe against loomd (the Kubernetes probe)"
in_loomd /opt/loom/bin/loom-health-probe --addr="$server" --ca=/run/loom/secrets/ca.crt \
  --server-name=loomd.loom.svc || die "the health probe failed against a serving loomd"
if in_loomd /opt/loom/bin/loom-health-probe --addr="$server" --ca=/run/loom/secrets/ca.crt \
  --server-name=not-loomd.example 2>/dev/null; then
  die "the health probe passed with a name the certificate does not carry"
fi

echo "check ($mode): loom-worker and loom-train (worker image)"
start loom-worker "$out/check-worker.log" --coordinator="$server" --name=image-check \
  --cpu-devices=1 --work-dir=/var/lib/loom/work --checkpoint-roots=/var/lib/loom/checkpoints \
  --tls-ca=/run/loom/secrets/ca.crt --join-token-file=/run/loom/secrets/node.token \
  --ready-file=/var/lib/loom/work/worker.ready
wait_file "$w_work/worker.ready" 60 ||
  { cat "$out/check-worker.log"; die "the worker did not start"; }

echo "check ($mode): the demo job (examples/demo.yaml), submitted with loomctl from the loomd image"
ctl() {
  in_loomd env LOOM_SERVER="$server" LOOM_TLS_CA=/run/loom/secrets/ca.crt \
    LOOM_TOKEN_FILE=/run/loom/secrets/user.token /opt/loom/bin/loomctl "$@"
}
job=$(ctl submit -f /var/lib/loom/state/demo.yaml -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
echo "check ($mode): submitted $job"
# Follow it for at most 10 minutes (the demo takes well under one).
ctl watch "$job" >"$out/check-watch.log" 2>&1 &
watcher=$!
for ((i = 0; i < 600; i++)); do kill -0 "$watcher" 2>/dev/null || break; sleep 1; done
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
tail -n 1 "$out/check-watch.log"
state=$(ctl get "$job" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
if [[ $state != SUCCEEDED && $state != JOB_STATE_SUCCEEDED ]]; then
  tail -n 30 "$out/check-loomd.log" "$out/check-worker.log"
  die "$job ended $state"
fi
echo "check ($mode): PASS: $job $state, from the images in $(($(date +%s) - start)) s"
