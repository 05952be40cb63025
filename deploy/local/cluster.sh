#!/usr/bin/env bash
# A local Loom cluster on loopback: one loomd and N loom-worker processes, each on port 0, with
# their bound addresses in ready files. Usage:
#   deploy/local/cluster.sh up [RUN_DIR] [WORKERS] [DEVICES]   start; writes RUN_DIR/env to source
#   deploy/local/cluster.sh down [RUN_DIR]                     stop everything started by `up`
# WORKERS defaults to 2, DEVICES (CPU devices per worker) to 1: `up DIR 2 4` gives 8 devices,
# enough for examples/parallel.yaml. Binaries come from build/bin (LOOM_BIN overrides).
#
# LOOM_WORKER_FLAGS adds flags to every loom-worker (split on spaces), e.g.
# LOOM_WORKER_FLAGS=--measure-devices=0 skips the start-up device measurement in tests.
#
# LOOM_PROMETHEUS=1 also starts a Prometheus server (Debian's `prometheus`) on loopback with
# deploy/prometheus's configuration and alert rules, scraping loomd and every worker each second;
# RUN_DIR/env then sets LOOM_PROMETHEUS_URL. Point Grafana at it to use deploy/grafana.
#
# Secure like a real cluster: scripts/dev-certs.sh makes a development CA, loomd's certificate and
# tokens in RUN_DIR/certs (kept across runs); loomd serves TLS and checks tokens, the workers join
# with the node token. `. RUN_DIR/env` sets LOOM_SERVER, LOOM_TLS_CA and LOOM_TOKEN_FILE (the user
# token of tenant "dev") for loomctl. LOOM_INSECURE=1 starts the old plaintext, unauthenticated
# loopback cluster instead.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${LOOM_BIN:-$root/build/bin}"
cmd="${1:-up}"
run="${2:-$root/.cache/local-cluster}"
workers="${3:-2}"
devices="${4:-1}"
if ! [[ $workers =~ ^[1-9][0-9]*$ && $devices =~ ^[1-9][0-9]*$ ]]; then
  echo "cluster: WORKERS and DEVICES must be positive integers (got '$workers' and '$devices')" >&2
  exit 2
fi
# Checkpoint dirs the jobs may use: every worker runs on this host, so this one folder is shared
# by all of them (examples/parallel.yaml writes under it). Ranks run as `nobody` when the workers
# run as root, so it is world-writable with the sticky bit, like /tmp.
checkpoints="${LOOM_CHECKPOINT_ROOT:-/tmp/loom-checkpoints}"

wait_file() {  # wait_file PATH SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "cluster: $1 did not appear within $2 s" >&2
  return 1
}
json_field() {  # json_field FILE KEY
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# Starts Prometheus with a copy of deploy/prometheus (configuration, rules) in RUN_DIR/prometheus,
# its file_sd targets written from the ready files, scraping every second; writes its URL to
# RUN_DIR/prometheus.url.
start_prometheus() {
  local dir="$run/prometheus" port i w targets
  if ! command -v prometheus >/dev/null; then
    echo "cluster: LOOM_PROMETHEUS=1 but no prometheus on PATH (scripts/setup.sh installs it)" >&2
    return 1
  fi
  rm -rf "$dir" && mkdir -p "$dir/targets" "$dir/data"
  cp -r "$root/deploy/prometheus/rules" "$dir/rules"
  sed -e 's/^  scrape_interval: .*/  scrape_interval: 1s/' \
      -e 's/^  evaluation_interval: .*/  evaluation_interval: 1s/' \
      "$root/deploy/prometheus/prometheus.yml" >"$dir/prometheus.yml"
  echo "[{\"targets\": [\"$(json_field "$run/loomd.ready" metrics)\"]}]" >"$dir/targets/loomd.json"
  targets=""
  for ((w = 0; w < workers; w++)); do
    targets+="${targets:+, }\"$(json_field "$run/worker-$w.ready" metrics)\""
  done
  echo "[{\"targets\": [$targets]}]" >"$dir/targets/workers.json"
  # Prometheus cannot bind port 0 and say which it got: take a free port, retry if it is taken.
  for ((i = 0; i < 5; i++)); do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (cd "$dir" && exec prometheus --config.file=prometheus.yml --storage.tsdb.path=data \
       --web.listen-address="127.0.0.1:$port" --log.level=warn) >"$run/prometheus.log" 2>&1 &
    echo $! >"$run/prometheus.pid"
    for ((w = 0; w < 100; w++)); do
      if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
           "http://127.0.0.1:$port/-/ready" 2>/dev/null; then
        echo "http://127.0.0.1:$port" >"$run/prometheus.url"
        return 0
      fi
      kill -0 "$(cat "$run/prometheus.pid")" 2>/dev/null || break
      sleep 0.1
    done
    kill "$(cat "$run/prometheus.pid")" 2>/dev/null || true
  done
  echo "cluster: Prometheus did not start; see $run/prometheus.log" >&2
  return 1
}

case "$cmd" in
  up)
    "$0" down "$run" >/dev/null 2>&1 || true
    mkdir -p "$run"
    mkdir -p "$checkpoints" && chmod 1777 "$checkpoints"
    rm -f "$run"/*.ready
    run=$(cd "$run" && pwd)
    certs="$run/certs"
    if [[ ${LOOM_INSECURE:-0} == 1 ]]; then
      loomd_security=(--insecure)
      worker_security=()
    else
      bash "$root/scripts/dev-certs.sh" "$certs" >/dev/null
      loomd_security=(--tls-cert="$certs/loomd.pem" --tls-key="$certs/loomd.key"
                      --tls-client-ca="$certs/ca.pem" --tokens-file="$certs/tokens")
      worker_security=(--tls-ca="$certs/ca.pem" --join-token-file="$certs/node.token")
    fi
    "$bin/loomd" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --state-dir="$run/loomd" \
      --checkpoint-roots="$checkpoints" --ready-file="$run/loomd.ready" "${loomd_security[@]}" \
      >"$run/loomd.log" 2>&1 &
    echo $! >"$run/loomd.pid"
    wait_file "$run/loomd.ready" 30
    server=$(json_field "$run/loomd.ready" grpc)
    # A root worker runs its ranks as `nobody`, who must reach the rank program and the work
    # dirs; in a private folder (a clone under /root) it cannot, and this loopback demo then
    # opts out explicitly. A real deployment installs the binaries where every user can run them.
    rank_user=()
    if [ "$(id -u)" = 0 ] && ! runuser -u nobody -- test -x "$bin/loom-train" 2>/dev/null; then
      echo "cluster: user nobody cannot run $bin/loom-train (a private folder?); the ranks run as root (--rank-user=root)" >&2
      rank_user=(--rank-user=root)
    fi
    read -r -a worker_flags <<<"${LOOM_WORKER_FLAGS:-}"
    for ((w = 0; w < workers; w++)); do
      "$bin/loom-worker" --coordinator="$server" --name="worker-$w" --cpu-devices="$devices" \
        --checkpoint-roots="$checkpoints" "${rank_user[@]}" "${worker_flags[@]}" \
        --work-dir="$run/worker-$w" --ready-file="$run/worker-$w.ready" \
        "${worker_security[@]}" >"$run/worker-$w.log" 2>&1 &
      echo $! >"$run/worker-$w.pid"
    done
    # A worker is ready once registered, after measuring its devices (about 3 s on a quiet
    # machine; the workers of one host take turns, and a loaded machine is slower).
    for ((w = 0; w < workers; w++)); do wait_file "$run/worker-$w.ready" 180; done
    echo "$server" >"$run/server"
    prometheus_url=""
    if [[ ${LOOM_PROMETHEUS:-0} == 1 ]]; then
      start_prometheus
      prometheus_url=$(cat "$run/prometheus.url")
    fi
    {
      echo "export LOOM_SERVER=$server"
      if [[ ${LOOM_INSECURE:-0} != 1 ]]; then
        echo "export LOOM_TLS_CA=$certs/ca.pem LOOM_TOKEN_FILE=$certs/user.token"
      fi
      if [[ -n $prometheus_url ]]; then echo "export LOOM_PROMETHEUS_URL=$prometheus_url"; fi
    } >"$run/env"
    echo "cluster: loomd at $server (metrics $(json_field "$run/loomd.ready" metrics)), $workers workers x $devices devices${prometheus_url:+, Prometheus at $prometheus_url}; logs in $run"
    ;;
  down)
    for f in "$run"/worker-*.pid "$run"/loomd.pid "$run"/prometheus.pid; do
      [ -f "$f" ] || continue
      kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    sleep 0.5
    for f in "$run"/worker-*.pid "$run"/loomd.pid "$run"/prometheus.pid; do
      [ -f "$f" ] || continue
      kill -KILL "$(cat "$f")" 2>/dev/null || true
      rm -f "$f"
    done
    ;;
  *)
    echo "usage: $0 up|down [RUN_DIR] [WORKERS] [DEVICES]" >&2
    exit 2
    ;;
esac
