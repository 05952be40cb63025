#!/usr/bin/env bash
# Runs the README's "Using it" block exactly as written (the first ```sh block under that
# heading), from the repository root, stopping at the first command that fails; the cluster it
# starts is stopped on every exit. Needs the binaries in build/bin (scripts/build.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
block=$(awk '/^## Using it/ {on = 1; next}
             on && /^```sh$/ {inside = 1; next}
             inside && /^```$/ {exit}
             inside {print}' README.md)
if [[ -z $block ]] || ! grep -q 'cluster.sh up' <<<"$block"; then
  echo "readme test: no \`\`\`sh block with cluster.sh up under '## Using it' in README.md" >&2
  exit 1
fi
trap 'deploy/local/cluster.sh down .cache/cluster >/dev/null 2>&1 || true; rm -f trace.json scaling.svg' EXIT
n=0
while IFS= read -r line; do
  [[ -z ${line// /} ]] && continue
  n=$((n + 1))
  echo "+ $line"
  # One shell runs every line, so variables (JOB) and the sourced env carry over.
  eval "$line" || { echo "readme test: line $n failed: $line" >&2; exit 1; }
done <<<"$block"
[[ -s trace.json ]] || { echo "readme test: trace.json was not written" >&2; exit 1; }
[[ -s scaling.svg ]] || { echo "readme test: scaling.svg was not written" >&2; exit 1; }
echo "readme test: all $n lines ran"
