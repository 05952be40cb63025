#!/usr/bin/env bash
# The demo: sets up, builds, starts a local cluster (loomd + two workers on loopback), submits
# examples/demo.yaml (a tiny GPT on the built-in corpus) and follows it to the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# gcc's OpenMP spins while waiting by default, which on a shared or small machine makes the
# CPU kernels many times slower (docs/benchmarks.md); waiting threads should sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

bash scripts/setup.sh
# Only what the demo runs (the tests are most of a full build).
LOOM_BUILD_TARGETS="loomd loom-worker loom-train loomctl" bash scripts/build.sh

run=.cache/demo-cluster
trap 'deploy/local/cluster.sh down "$run"' EXIT
deploy/local/cluster.sh up "$run" 2
# LOOM_SERVER, and the CA and user token of the cluster's TLS and tokens.
. "$run/env"

build/bin/loomctl nodes
job=$(build/bin/loomctl submit -f examples/demo.yaml -o json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
echo "submitted $job"
build/bin/loomctl watch "$job"
build/bin/loomctl get "$job"
echo "last lines of the job's log:"
build/bin/loomctl logs "$job" | tail -n 5
