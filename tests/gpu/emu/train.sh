#!/usr/bin/env bash
# Builds and runs the GPU training path in the CPU emulation against the CPU trainer
# (tests/gpu/emu/README.md, "The training path"):
#   tests/gpu/emu/train.sh [steps]      (default 8)
# The CUDA side (the kernels of kernels/cuda/ rewritten by rewrite_launches.py, GptCuda, the
# CUDA backend, worker/train/device/) is compiled with the emulation's force-included header; the
# CPU side (the sources of the CMake libraries loom_train_core and loom_kernels, read from their
# CMakeLists.txt) with plain g++ and OpenBLAS, as CMake builds them. Needs g++ (C++20), python3,
# OpenBLAS and the CUDA headers (CUDA_HOME, default /usr/local/cuda); no GPU, no CUDA library.
# Builds in build-emu/train/ at the repository root; rebuilds what changed (sources and the
# headers they include). JOBS=N compiles N files at a time (default 2). EMU_PARTS selects the
# checks (below).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=$ROOT/build-emu/train
EMU=$ROOT/tests/gpu/emu
source "$EMU/compiler.sh"
mkdir -p "$OUT/src" "$OUT/obj"
# One build at a time in $OUT (two sessions may run this at once); the runs may overlap.
exec 9>"$OUT/.lock"
flock 9
# The kernels as they are (no chunk override): the training run executes the device's code.
python3 "$EMU/rewrite_launches.py" "$ROOT" "$OUT/src"

# The sources of a CMake add_library(NAME ...) block, relative to its folder.
cmake_sources() {
  sed -n "/^\s*add_library($2\$/,/^\s*)/p" "$ROOT/$1/CMakeLists.txt" |
    grep -E '^\s+[A-Za-z_/]+\.cc' |
    sed -e 's/^\s*//' -e "s|^|$ROOT/$1/|"
}
mapfile -t CORE < <(cmake_sources worker/train loom_train_core)
# loom_train_core links the trace ring's own library (the format loom-worker reads too).
mapfile -t -O "${#CORE[@]}" CORE < <(cmake_sources worker/train loom_trace_ring)
mapfile -t CPU_KERNELS < <(cmake_sources kernels loom_kernels)
mapfile -t CUDA_TRAIN < <(cmake_sources worker/train loom_train_cuda)
if ((${#CORE[@]} < 10 || ${#CPU_KERNELS[@]} < 5 || ${#CUDA_TRAIN[@]} < 2)); then
  echo "train.sh: could not read the library sources from the CMakeLists.txt files" >&2
  exit 1
fi
# worker/train/device/: the caching allocator is plain C++; the rest wraps the CUDA runtime.
EMULATED=("$OUT"/src/*.cc "$EMU/cuda_emu_runtime.cc" "$EMU/emu_train_main.cc" "${CUDA_TRAIN[@]}")
for src in "$ROOT"/worker/train/device/*.cc; do
  [[ $src == */caching_allocator.cc ]] || EMULATED+=("$src")
done
PLAIN=("${CORE[@]}" "${CPU_KERNELS[@]}" "$ROOT/worker/train/device/caching_allocator.cc")

# -fsanitize=alignment: a 16-byte vector load or store (Pack8) at an address that is not a
# multiple of 16 faults on a GPU but not on x86, so UBSan reports it here and stops.
EMU_FLAGS=(-std=c++20 -O1 -g0 -pthread -w -include "$EMU/cuda_emu.h" -I"$ROOT"
           -isystem "$CUDA_HOME/include" -fsanitize=alignment -fno-sanitize-recover=alignment)
PLAIN_FLAGS=(-std=c++20 -O2 -g0 -pthread -fopenmp -I"$ROOT" -isystem "$CUDA_HOME/include")

# Objects built with other flags are rebuilt.
FLAGS_STAMP="${EMU_FLAGS[*]} | ${PLAIN_FLAGS[*]}"
if [[ ! -f $OUT/flags || $(cat "$OUT/flags") != "$FLAGS_STAMP" ]]; then
  rm -f "$OUT"/obj/*.o
  echo "$FLAGS_STAMP" >"$OUT/flags"
fi

# True when $1 (an object) is missing or older than a file its dependency list names.
stale() {
  [[ -f $1 && -f $1.d ]] || return 0
  local dep
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$1.d"); do
    [[ $dep -nt $1 ]] && return 0
  done
  return 1
}

OBJECTS=()
FAILED=0
compile() {  # compile FLAGS_ARRAY_NAME SOURCE...
  local -n flags=$1
  shift
  local src obj
  for src in "$@"; do
    obj=$OUT/obj/$(realpath --relative-to="$ROOT" "$src" | tr / _).o
    OBJECTS+=("$obj")
    if stale "$obj"; then
      echo "compiling ${src#"$ROOT"/}"
      ("${CXX[@]}" "${flags[@]}" -MMD -MF "$obj.d" -c "$src" -o "$obj" || { rm -f "$obj"; exit 1; }) &
    fi
    while (($(jobs -r | wc -l) >= ${JOBS:-2})); do sleep 0.2; done
  done
}
compile EMU_FLAGS "${EMULATED[@]}"
compile PLAIN_FLAGS "${PLAIN[@]}"
for job in $(jobs -p); do wait "$job" || FAILED=1; done
((FAILED == 0)) || { echo "train.sh: compilation failed" >&2; exit 1; }
BIN=$OUT/emu_train_check
relink=0
[[ -f $BIN ]] || relink=1
for obj in "${OBJECTS[@]}"; do [[ $obj -nt $BIN ]] && relink=1; done
if ((relink)); then
  g++ -pthread -fopenmp -fsanitize=alignment "${OBJECTS[@]}" -lopenblas -ldl -o "$BIN"
fi

# The data-parallel check (emu_dp_main.cc): the trainer's sources again with LOOM_HAVE_NCCL, the
# gradient buckets, and the driver's stand-in for NCCL instead of emu_train_main.cc.
# The layout matrix (emu_layout_main.cc) links the same objects with its own driver.
DP_OBJECTS=()
for obj in "${OBJECTS[@]}"; do
  case $obj in
    */tests_gpu_emu_emu_train_main.cc.o | */worker_train_cuda_backend.cc.o) ;;
    *) DP_OBJECTS+=("$obj") ;;
  esac
done
DP_FLAGS=("${EMU_FLAGS[@]}" -DLOOM_HAVE_NCCL)
for src in "$ROOT/worker/train/cuda_backend.cc" "$ROOT/worker/train/cuda_grad_sync.cc" \
           "$EMU/thread_nccl.cc" "$EMU/emu_dp_main.cc" "$EMU/emu_layout_main.cc" \
           "$EMU/emu_comm_main.cc" "$ROOT/tests/gpu/comm_checks.cc"; do
  obj=$OUT/obj/dp_$(realpath --relative-to="$ROOT" "$src" | tr / _).o
  DP_OBJECTS+=("$obj")
  if stale "$obj"; then
    echo "compiling ${src#"$ROOT"/} (data parallel)"
    ("${CXX[@]}" "${DP_FLAGS[@]}" -MMD -MF "$obj.d" -c "$src" -o "$obj" || { rm -f "$obj"; exit 1; }) &
  fi
  while (($(jobs -r | wc -l) >= ${JOBS:-2})); do sleep 0.2; done
done
for job in $(jobs -p); do wait "$job" || FAILED=1; done
((FAILED == 0)) || { echo "train.sh: compilation failed" >&2; exit 1; }
# link BINARY DRIVER: the data-parallel objects with one driver (a main) of the three.
DRIVERS=(_emu_dp_main.cc.o _emu_layout_main.cc.o _emu_comm_main.cc.o)
link() {
  local bin=$1 keep=$2 objs=() obj relink=0 d skip
  for obj in "${DP_OBJECTS[@]}"; do
    skip=0
    for d in "${DRIVERS[@]}"; do [[ $obj == *"$d" && $d != "$keep" ]] && skip=1; done
    ((skip)) || objs+=("$obj")
  done
  [[ -f $bin ]] || relink=1
  for obj in "${objs[@]}"; do [[ $obj -nt $bin ]] && relink=1; done
  if ((relink)); then
    g++ -pthread -fopenmp -fsanitize=alignment "${objs[@]}" -lopenblas -ldl -o "$bin"
  fi
}
DP_BIN=$OUT/emu_dp_check
LAYOUT_BIN=$OUT/emu_layout_check
COMM_BIN=$OUT/emu_comm_check
link "$DP_BIN" _emu_dp_main.cc.o
link "$LAYOUT_BIN" _emu_layout_main.cc.o
link "$COMM_BIN" _emu_comm_main.cc.o
exec 9>&-
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# EMU_PARTS (default "single dp layout comm") picks the checks to run, e.g. EMU_PARTS=layout.
parts=" ${EMU_PARTS:-single dp layout comm} "
status=0
if [[ $parts == *" single "* ]]; then
  "$BIN" "$@" || status=1
  echo
fi
# dp = 2 for as many steps as the first argument asks (default 3), at the padded vocabulary too.
if [[ $parts == *" dp "* ]]; then
  "$DP_BIN" "${1:-3}" 257 || status=1
  echo
fi
# The layout matrix (tensor, pipeline, both schedules, dp x tp x pp, ZeRO-1, a checkpoint across
# layouts and onto the CPU): EMU_LAYOUT=quick runs two layouts (scripts/test.sh), off none.
if [[ $parts == *" layout "* ]]; then
  case ${EMU_LAYOUT:-full} in
    off) ;;
    quick) "$LAYOUT_BIN" "${1:-3}" quick || status=1 ;;
    *) "$LAYOUT_BIN" "${1:-3}" || status=1 ;;
  esac
fi
# The communication check's core (tests/gpu/comm_checks.h) over the NCCL stand-in.
if [[ $parts == *" comm "* ]]; then
  "$COMM_BIN" || status=1
fi
exit $status
