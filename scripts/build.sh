#!/usr/bin/env bash
# Configures and builds Loom into build/ (binaries in build/bin). Uses ccache when present; the
# cache is keyed by content, so a clean clone rebuilds correctly. LOOM_BUILD_TARGETS (space
# separated, e.g. "loomd loomctl") builds only those targets and what they need; the demo builds
# only its four binaries this way.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # Paths inside the tree are hashed relative to it, so another clone of the project hits the
  # same cache entries (the cache is keyed by content, so this stays correct).
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
jobs=${LOOM_BUILD_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@" >/dev/null
read -r -a targets <<<"${LOOM_BUILD_TARGETS:-}"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build build -j"$jobs" --target "${targets[@]}"
else
  cmake --build build -j"$jobs"
fi
