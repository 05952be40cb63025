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

# The CUDA code on the CPU (tests/gpu/emu/README.md): without a GPU, the kernels' op checks and
# emulated training steps of the GPU path beside the CPU trainer (one rank, dp = 2, then the
# layout matrix: tensor, pipeline with both schedules, data x tensor x pipeline, ZeRO-1, a
# checkpoint across layouts and onto the CPU, with a stand-in for NCCL; then the communication
# check's core) are what exercises it here.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ -f $cuda_home/include/cuda_runtime_api.h ]]; then
  echo "== emulated CUDA: op checks, then the GPU training path (tests/gpu/emu)"
  CUDA_HOME=$cuda_home bash tests/gpu/emu/run.sh >build/emu-ops.log 2>&1 ||
    { status=1; tail -40 build/emu-ops.log; }
  CUDA_HOME=$cuda_home bash tests/gpu/emu/run.sh --odd >build/emu-ops-odd.log 2>&1 ||
    { status=1; tail -40 build/emu-ops-odd.log; }
  EMU_LAYOUT=full CUDA_HOME=$cuda_home bash tests/gpu/emu/train.sh 2 >build/emu-train.log 2>&1 ||
    { status=1; tail -60 build/emu-train.log; }
  grep -hE '^(PASS|FAIL)' build/emu-ops.log build/emu-ops-odd.log build/emu-train.log | tail -30
else
  echo "== emulated CUDA: SKIPPED (no CUDA headers in $cuda_home)"
fi

# The fuzz targets (tests/fuzz/README.md): a clang build under ASan and UBSan in build-fuzz/, then
# every target for LOOM_FUZZ_SECONDS (default 20) from its seed corpus; any crash fails the run.
# (The seeds and kept crash inputs also replay in the ctest run above: fuzz_*_corpus.)
if command -v clang++-14 >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1; then
  echo "== fuzz: libFuzzer targets, ${LOOM_FUZZ_SECONDS:-20} s each (tests/fuzz/run.sh)"
  bash tests/fuzz/run.sh "${LOOM_FUZZ_SECONDS:-20}" || status=1
else
  echo "== fuzz: SKIPPED (no clang; scripts/setup.sh installs clang-14)"
fi
exit $status
