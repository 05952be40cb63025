#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/README.md) with clang under ASan and UBSan into
# build-fuzz/, then runs each for SECONDS (default 30) starting from its seed corpus in
# tests/fuzz/corpus/<target>/. Fails when any target finds a crash, a leak, undefined behaviour
# or a timeout; the input that did it is kept in build-fuzz/fuzz-artifacts/ and the command to
# replay it is printed.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#
# LOOM_BUILD_JOBS: build parallelism (default: all cores). New inputs the fuzzer finds go to
# build-fuzz/fuzz-corpus/<target>/ (kept between runs, so later runs start further on); the
# checked-in seeds are only read. Logs: build-fuzz/fuzz-logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${1:-30}
shift || true
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -eq 0 ]]; then
  echo "run.sh: SECONDS_PER_TARGET must be a positive integer, got '$seconds'" >&2
  exit 2
fi

cc=$(command -v clang-14 || command -v clang || true)
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [[ -z $cc || -z $cxx ]]; then
  echo "run.sh: clang is not installed; bash scripts/setup.sh installs clang-14" >&2
  exit 2
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
jobs=${LOOM_BUILD_JOBS:-$(nproc)}
build_start=$SECONDS
CC=$cc CXX=$cxx cmake -S . -B build-fuzz -DLOOM_FUZZ=ON -DLOOM_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j"$jobs" --target loom_fuzzers
echo "== fuzz: built in $((SECONDS - build_start)) s"

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for bin in build-fuzz/fuzz/*_fuzz; do
    name=$(basename "$bin")
    targets+=("${name%_fuzz}")
  done
fi

mkdir -p build-fuzz/fuzz-artifacts build-fuzz/fuzz-logs
# halt_on_error: UBSan's findings fail the run like ASan's; leaks are found by libFuzzer's
# own -detect_leaks (on by default).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1}
status=0
for name in "${targets[@]}"; do
  bin=build-fuzz/fuzz/${name}_fuzz
  seeds=tests/fuzz/corpus/$name
  if [[ ! -x $bin || ! -d $seeds ]]; then
    echo "run.sh: unknown target '$name' (no $bin or no $seeds)" >&2
    status=1
    continue
  fi
  corpus=build-fuzz/fuzz-corpus/$name
  log=build-fuzz/fuzz-logs/$name.log
  mkdir -p "$corpus"
  # -timeout: one input running 10 s is a hang. -rss_limit_mb: more than 2 GiB is a memory bug
  # (inputs are at most a few KiB). New inputs go to the first directory only.
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/fuzz-artifacts/$name-" "$corpus" "$seeds" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  printf '%-16s %-6s %10s runs %7s exec/s  %s  corpus %s\n' "$name" "$result" "${runs:-?}" \
    "${rate:-?}" "${cov:-cov: ?}" "$(ls "$corpus" | wc -l)"
  if [[ $result == FAILED ]]; then
    grep -E 'ERROR: |runtime error|SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/    /'
    echo "    log: $log"
    echo "    replay: $bin build-fuzz/fuzz-artifacts/$name-<crash file>"
  fi
done
exit $status
