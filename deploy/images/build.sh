#!/usr/bin/env bash
# Builds Loom's container images from Debian packages only (no registry image is used):
#   loomd        loomd, loomctl and loom-health-probe (the Kubernetes probe; python3-grpcio)
#   loom-worker  loom-worker and loom-train (the ranks)
# and, with --cuda, loom-worker-cuda: the same with the CUDA runtime libraries loom-train links,
# taken from the Debian packages that own them (bookworm's non-free nvidia-cuda-toolkit line);
# it refuses a loom-train linked against a CUDA toolkit that is not Debian's.
#
# Each image: `mmdebstrap` makes a minimal bookworm root file system holding exactly the Debian
# packages that own the libraries the binaries load (found with ldd and dpkg -S), the binaries go
# to /opt/loom/bin, a non-root user `loom` (uid and gid 10001) owns /var/lib/loom, and `umoci`
# turns it into an OCI image layout. Names and tags: deploy/images/images.env.
#
# Usage: deploy/images/build.sh [--cuda] [--out DIR] [--bin DIR] [--only loomd|loom-worker]
#   --out  where the images go (default .cache/images): DIR/rootfs/NAME (the root file systems,
#          kept for deploy/images/check.sh) and DIR/oci (one OCI layout, tags NAME-TAG)
#   --bin  the built binaries (default build/bin)
# Needs root (mmdebstrap's root mode), network access to a Debian mirror, and
# `scripts/setup.sh --images` (mmdebstrap, umoci). Push with skopeo (Debian), e.g.
#   skopeo copy oci:.cache/images/oci:loomd-0.1.0 docker://REGISTRY/loom/loomd:0.1.0
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=images.env
. "$root/deploy/images/images.env"
out="$root/.cache/images"
bin="$root/build/bin"
cuda=0
only=""
while (($#)); do
  case "$1" in
    --cuda) cuda=1 ;;
    --out) out="$2"; shift ;;
    --bin) bin="$2"; shift ;;
    --only) only="$2"; shift ;;
    *) echo "usage: $0 [--cuda] [--out DIR] [--bin DIR] [--only loomd|loom-worker]" >&2; exit 2 ;;
  esac
  shift
done
suite=bookworm
mirror=${LOOM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${LOOM_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

die() { echo "images: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (mmdebstrap's root mode makes the device nodes and owners)"
for tool in mmdebstrap umoci dpkg-query ldd cmake objcopy; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh --images"
done

# debian_packages BINARY...: the Debian packages that own the shared libraries the binaries load.
# A library no Debian package owns is an error naming it (the image would not run without it).
debian_packages() {
  local lib real pkg
  local -A pkgs=()
  while read -r lib; do
    real=$(readlink -f "$lib")
    # usrmerge: dpkg knows a file by the path its package shipped, /lib or /usr/lib.
    pkg=""
    for candidate in "$lib" "$real" "${lib#/usr}" "/usr$lib" "${real#/usr}" "/usr$real"; do
      pkg=$(dpkg-query -S "$candidate" 2>/dev/null | head -n1 | cut -d: -f1)
      [[ -n $pkg ]] && break
    done
    [[ -n $pkg ]] || die "$lib (loaded by $*) is in no Debian package; the images hold Debian's \
libraries only (a CUDA toolkit from elsewhere: build loom-train with Debian's nvidia-cuda-toolkit)"
    pkgs[$pkg]=1
  done < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
  echo "${!pkgs[@]}"
}

# build_image NAME IMAGE EXTRA_PACKAGES PROGRAM...: the root file system and the OCI image; the
# first PROGRAM (a path) is the image's entry point.
build_image() {
  local name=$1 image=$2 extra=$3
  shift 3
  local paths=("$@") b
  for b in "${paths[@]}"; do
    [[ -x $b ]] || die "$b is missing: build it (cmake --build build --target $(basename "$b"))"
  done
  local packages
  packages=$(debian_packages "${paths[@]}")
  packages="$packages $extra"
  local components=main
  if [[ $packages =~ cuda|cublas|nccl ]]; then components="main contrib non-free"; fi
  echo "images: $name: Debian packages: $(echo "$packages" | tr ' ' '\n' | sort -u | xargs)"
  local rootfs="$out/rootfs/$name"
  rm -rf "$rootfs"
  mkdir -p "$out/rootfs"
  local hooks=(
    --customize-hook="mkdir -p \"\$1/opt/loom/bin\""
  )
  # The binaries without their debug sections (RelWithDebInfo: most of their size); symbols stay,
  # so stack traces keep their function names.
  local stage="$out/stage-$name"
  rm -rf "$stage" && mkdir -p "$stage"
  for b in "${paths[@]}"; do
    objcopy --strip-debug "$b" "$stage/$(basename "$b")"
    hooks+=(--customize-hook="copy-in $stage/$(basename "$b") /opt/loom/bin")
  done
  if [[ $name == loomd ]]; then
    hooks+=(--customize-hook="copy-in $root/deploy/images/loom-health-probe /opt/loom/bin")
  fi
  hooks+=(
    --customize-hook='chroot "$1" groupadd --gid 10001 loom'
    --customize-hook='chroot "$1" useradd --uid 10001 --gid 10001 --home-dir /var/lib/loom \
      --create-home --shell /usr/sbin/nologin loom'
    --customize-hook='mkdir -p "$1/run/loom/secrets" && chown 10001:10001 "$1/run/loom/secrets"'
    # No package lists or caches in the image.
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
    --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/*'
  )
  # minbase: essential packages and apt only; no recommends.
  mmdebstrap --quiet --mode=root --variant=minbase --components="$components" \
    --include="$(echo "$packages" | xargs | tr ' ' ',')" \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${hooks[@]}" "$suite" "$rootfs" \
    "deb $mirror $suite $components" "deb $mirror $suite-updates $components" \
    "deb $security $suite-security $components"

  # The OCI image: one layer holding the root file system, run as loom by default.
  local layout="$out/oci" tag="$name-$LOOM_IMAGE_TAG" bundle="$out/bundle-$name"
  [[ -d $layout ]] || umoci init --layout "$layout"
  umoci rm --image "$layout:$tag" 2>/dev/null || true
  umoci new --image "$layout:$tag"
  rm -rf "$bundle"
  umoci unpack --image "$layout:$tag" "$bundle"
  rm -rf "$bundle/rootfs"
  cp -a "$rootfs" "$bundle/rootfs"
  umoci repack --image "$layout:$tag" "$bundle"
  rm -rf "$bundle"
  umoci config --image "$layout:$tag" --config.user=10001:10001 \
    --config.entrypoint="/opt/loom/bin/$(basename "${paths[0]}")" \
    --config.workingdir=/var/lib/loom \
    --config.env=PATH=/opt/loom/bin:/usr/local/bin:/usr/bin:/bin \
    --config.label="org.opencontainers.image.title=$image" \
    --config.label="org.opencontainers.image.version=$LOOM_IMAGE_TAG"
  umoci gc --layout "$layout"
  rm -rf "$stage"
  echo "images: $name -> $image:$LOOM_IMAGE_TAG (oci:$layout:$tag)," \
    "$(du -sh "$rootfs" | cut -f1) unpacked"
}

# cpu_train: a loom-train without the CUDA backend for the CPU worker image. build/bin's links
# the CUDA libraries wherever nvcc was found at configure time; then one is built in
# build-images/ (-DLOOM_CUDA=OFF; ccache makes a rebuild quick).
cpu_train() {
  if ! ldd "$bin/loom-train" | grep -q 'libcudart'; then
    echo "$bin/loom-train"
    return
  fi
  echo "images: $bin/loom-train links CUDA; building a CPU-only loom-train in build-images/" >&2
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then
    export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$root" -B "$root/build-images" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_CUDA=OFF \
    "${launcher[@]}" >/dev/null
  cmake --build "$root/build-images" -j"${LOOM_BUILD_JOBS:-$(nproc)}" --target loom-train >&2
  echo "$root/build-images/bin/loom-train"
}

start=$(date +%s)
mkdir -p "$out"
if [[ -z $only || $only == loomd ]]; then
  # python3-grpcio runs the probe; ca-certificates for TLS tooling in the image.
  build_image loomd "$LOOMD_IMAGE" "python3-grpcio ca-certificates" "$bin/loomd" "$bin/loomctl"
fi
if [[ -z $only || $only == loom-worker ]]; then
  if ((cuda)); then
    build_image loom-worker-cuda "$LOOM_WORKER_CUDA_IMAGE" "ca-certificates" \
      "$bin/loom-worker" "$bin/loom-train"
  else
    train=$(cpu_train)
    build_image loom-worker "$LOOM_WORKER_IMAGE" "ca-certificates" "$bin/loom-worker" "$train"
  fi
fi
echo "images: done in $(($(date +%s) - start)) s"
