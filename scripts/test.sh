#!/usr/bin/env bash
# Sets up, builds, and runs every test: the unit tests in parallel, then the integration tests
# (which start real loomd and loom-worker processes) one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
# gcc's OpenMP spins while waiting by default, which on a shared or small machine makes the
# CPU kernels many times slower (docs/benchmarks.md); waiting threads should sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

bash scripts/setup.sh
bash scripts/build.sh

jobs=${LOOM_TEST_JOBS:-$(nproc)}
# ctest runs one test process per core; a test process that also started a BLAS thread per core
# would oversubscribe the machine (measured: the convergence test 99 s instead of 4.5 s on 2
# cores). The kernels' own thread tests set their thread counts explicitly.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
status=0
ctest --test-dir build --output-on-failure -j"$jobs" -LE integration || status=1
ctest --test-dir build --output-on-failure -L integration || status=1
exit $status
