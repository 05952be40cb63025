#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s) render and validate: runs k8s_manifests_test.py in a
# virtual environment under .cache/ that holds the pinned schema validator from PyPI.
# Usage: tests/deploy/k8s_manifests.sh [BIN_DIR]   (BIN_DIR: loomd and loom-worker; build/bin)
# Exits 77 (ctest: skipped) only when no kubectl is on PATH; scripts/setup.sh installs one.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/build/bin}"

if ! command -v kubectl >/dev/null 2>&1; then
  echo "SKIPPED: no kubectl on PATH (scripts/setup.sh installs Debian's kubernetes-client)"
  exit 77
fi

# Pinned: a new release may bring new schemas or rules; bump it on purpose.
validator=kubernetes-validate==1.37.0
venv="$root/.cache/deploy-venv"
if [[ ! -f $venv/.installed ]] || [[ $(cat "$venv/.installed") != "$validator" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"  # Debian: python3-venv (scripts/setup.sh)
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$validator"
  echo "$validator" >"$venv/.installed"
fi
# Debian 12's own kubectl (1.20, kustomize v2) must render the overlays too: when the kubectl on
# PATH is a newer one, Debian's is unpacked (not installed) under .cache/ and both are compared.
old_kubectl=()
old="$root/.cache/deploy-kubectl-debian/usr/bin/kubectl"
if [[ ! -x $old ]] && command -v apt-get >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download -qq kubernetes-client >/dev/null 2>&1); then
    dpkg -x "$tmp"/kubernetes-client_*.deb "$root/.cache/deploy-kubectl-debian"
  fi
  rm -rf "$tmp"
fi
if [[ -x $old ]]; then
  old_kubectl=(--old-kubectl "$old")
else
  echo "NOTE: Debian's kubernetes-client could not be fetched; rendering with kubectl on PATH only"
fi
exec "$venv/bin/python" "$root/tests/deploy/k8s_manifests_test.py" --bin "$bin" "${old_kubectl[@]}"
