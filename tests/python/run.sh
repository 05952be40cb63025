#!/usr/bin/env bash
# The Python client's tests against a live local cluster (deploy/local/cluster.sh, TLS and
# tokens as it sets them up): installs `./client/python` and pytest into a virtual environment
# under .cache/, starts loomd and two workers from the build's binaries, runs pytest, and stops
# the cluster on every exit. Usage:
#   tests/python/run.sh [PYTEST ARGS...]
# LOOM_BIN names the folder of loomd, loom-worker and loom-train (default: build/bin).
# Needs PyPI (pinned versions) and Debian's python3-venv (scripts/setup.sh installs it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${LOOM_BIN:-$root/build/bin}"
venv="$root/.cache/python-client-venv"
run_dir="$root/.cache/python-client-cluster"
pytest_version=8.3.3

for b in loomd loom-worker loom-train; do
  [[ -x $bin/$b ]] || { echo "python tests: $bin/$b is missing; build it first" >&2; exit 2; }
done

if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv" || {
    echo "python tests: cannot create a virtual environment (apt-get install python3-venv)" >&2
    exit 2
  }
fi
# Always reinstalled, so that the stubs are generated from the proto/ of this tree.
"$venv/bin/pip" install --quiet --disable-pip-version-check "$root/client/python" \
  "pytest==$pytest_version"

# The workers' start-up device measurement (a few seconds each, much longer on a busy machine)
# says nothing about the client.
cluster() { LOOM_WORKER_FLAGS=--measure-devices=0 bash "$root/deploy/local/cluster.sh" "$@"; }
trap 'cluster down "$run_dir" >/dev/null 2>&1 || true' EXIT
cluster up "$run_dir" 2
# shellcheck disable=SC1091
. "$run_dir/env"
export LOOM_REPO_ROOT="$root" LOOM_CLUSTER_DIR="$run_dir"
cd "$root"
"$venv/bin/python" -m pytest -p no:cacheprovider -q "$root/tests/python" "$@"
