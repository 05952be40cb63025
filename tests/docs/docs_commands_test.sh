#!/usr/bin/env bash
# Runs the commands of the README and the user guide exactly as written, from the repository
# root, stopping at the first one that fails:
#   README.md              the ```sh block under "## Using it" (it starts and stops its cluster)
#   docs/user-guide.md     every ```sh block in order, on the cluster the guide tells the reader
#                          to start (started and stopped here), after planning its ```yaml spec
# One shell runs all the lines of one document, so variables (JOB) and the sourced env carry
# over. Needs the binaries in build/bin (scripts/build.sh) and, for the guide's Python section,
# PyPI. Usage: tests/docs/docs_commands_test.sh [readme|guide]... (default: both)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
cleanup() {
  deploy/local/cluster.sh down .cache/cluster >/dev/null 2>&1 || true
  rm -f trace.json scaling.svg .cache/user-guide-spec.yaml
}
trap cleanup EXIT

# run_lines NAME: runs stdin's lines one by one in this shell.
run_lines() {
  local name=$1 n=0 line
  while IFS= read -r line; do
    [[ -z ${line// /} ]] && continue
    n=$((n + 1))
    echo "+ $line"
    eval "$line" || { echo "docs test: $name line $n failed: $line" >&2; exit 1; }
  done
  echo "docs test: $name: all $n lines ran"
}

readme() {
  local block
  block=$(awk '/^## Using it/ {on = 1; next}
               on && /^```sh$/ {inside = 1; next}
               inside && /^```$/ {exit}
               inside {print}' README.md)
  if [[ -z $block ]] || ! grep -q 'cluster.sh up' <<<"$block"; then
    echo "docs test: no \`\`\`sh block with cluster.sh up under '## Using it' in README.md" >&2
    exit 1
  fi
  run_lines README.md <<<"$block"
  [[ -s trace.json && -s scaling.svg ]] ||
    { echo "docs test: README.md: trace.json or scaling.svg was not written" >&2; exit 1; }
  rm -f trace.json scaling.svg
}

guide() {
  local doc=docs/user-guide.md
  awk '/^```yaml$/ {inside = 1; next} inside && /^```$/ {exit} inside {print}' $doc \
    >.cache/user-guide-spec.yaml
  deploy/local/cluster.sh up .cache/cluster 2 4
  . .cache/cluster/env
  build/bin/loomctl plan -f .cache/user-guide-spec.yaml >/dev/null ||
    { echo "docs test: $doc: its example spec does not plan" >&2; exit 1; }
  run_lines $doc < <(awk '/^```sh$/ {inside = 1; next} inside && /^```$/ {inside = 0; next}
                          inside {print}' $doc)
  deploy/local/cluster.sh down .cache/cluster
}

mkdir -p .cache
for what in "${@:-readme guide}"; do
  for w in $what; do "$w"; done
done
