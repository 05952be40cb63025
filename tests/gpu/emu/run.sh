#!/usr/bin/env bash
# Builds and runs the CUDA op checks in the CPU emulation (tests/gpu/emu/README.md): the kernels
# of kernels/cuda/ compiled by the host compiler, one fiber per CUDA thread.
#   tests/gpu/emu/run.sh          small shapes (about half a minute on two cores, built)
#   tests/gpu/emu/run.sh --odd    the odd shapes of loom-gpu-op-check (similar)
# Needs g++ with C++20, python3 and the CUDA headers (CUDA_HOME, default /usr/local/cuda); no GPU
# and no CUDA libraries. Builds in build-emu/ at the repository root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=$ROOT/build-emu
EMU=$ROOT/tests/gpu/emu
source "$EMU/compiler.sh"
mkdir -p "$OUT/src" "$OUT/obj"
# A token chunk of 16 makes the encoder backward's multi-chunk path run at small shapes.
python3 "$EMU/rewrite_launches.py" "$ROOT" "$OUT/src" kTokenChunk=16
FLAGS=(-std=c++20 -O1 -pthread -w -include "$EMU/cuda_emu.h" -I"$ROOT" -I"$CUDA_HOME/include")
SOURCES=("$OUT"/src/*.cc "$EMU/cuda_emu_runtime.cc" "$EMU/emu_main.cc"
         "$ROOT/tests/gpu/op_checks.cc" "$ROOT"/kernels/ref/*.cc)
OBJECTS=()
for src in "${SOURCES[@]}"; do
  obj=$OUT/obj/$(basename "${src%.*}").o
  OBJECTS+=("$obj")
  if [[ ! -f $obj || $src -nt $obj || $EMU/cuda_emu.h -nt $obj ]]; then
    "${CXX[@]}" "${FLAGS[@]}" -c "$src" -o "$obj" &
  fi
  while (($(jobs -r | wc -l) >= ${JOBS:-2})); do sleep 0.2; done
done
wait
g++ -pthread "${OBJECTS[@]}" -o "$OUT/cuda_emu_check"
exec "$OUT/cuda_emu_check" "$@"
