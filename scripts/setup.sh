#!/usr/bin/env bash
# Installs every system dependency of Loom from Debian 12's packages. Idempotent: packages that
# are already installed are left alone, and apt is only asked when one is missing.
# The CUDA toolkit is optional and not installed here: when nvcc is on PATH (or in
# /usr/local/cuda/bin) the CUDA backend is built as well. clang-14 and its runtime libraries
# (libFuzzer, ASan, UBSan) build the fuzz targets (tests/fuzz/run.sh).
# `setup.sh --images` also installs what deploy/images needs (mmdebstrap, umoci; podman, runc).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsqlite3-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libgloo-dev libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev openssl prometheus python3 python3-venv
  clang-14 libclang-rt-14-dev
  prometheus-cpp-dev
  # loomctl's plaintext calls speak HTTP/2 through libnghttp2 (client/wire_client.h).
  libnghttp2-dev
  # tests/deploy: a virtual environment for the schema validator; deploy/k8s/generate.py.
  python3-yaml
)
# kubectl renders deploy/k8s (tests/deploy). Debian's kubernetes-client only when no kubectl is
# on PATH: a newer kubectl someone installed is left alone (the manifests render with both).
if ! command -v kubectl >/dev/null 2>&1; then
  packages+=(kubernetes-client)
fi
if [[ ${1:-} == --images ]]; then
  packages+=(mmdebstrap umoci podman runc)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
