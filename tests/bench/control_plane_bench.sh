#!/usr/bin/env bash
# Control-plane benchmark, side by side: Loom (this build) against Slurm when it is installed
# and answering (slurm-wlm; see --setup-slurm), and optionally against another Loom build
# (--base-bin, e.g. the build of an older commit). The systems are measured in alternating
# rounds (their order reversed every other round), so that the machine's background load falls
# on both alike; medians over the rounds and the ratios are printed. Not a test: it is not part
# of scripts/test.sh, and its figures go to docs/benchmarks.md with the date, machine and
# command.
#
#   tests/bench/control_plane_bench.sh [--bin=build/bin] [--base-bin=DIR] [--rounds=3]
#       [--loops=32] [--per-loop=32] [--serial=20] [--jobs=100] [--setup-slurm]
#
# Rows (each a median over the rounds):
#   start       one `loomctl --help` (process start alone)       | `sbatch --help`
#   submit      one `loomctl submit` on a quiet machine, the job held: the worker is stopped, so
#               the jobs only queue (the first 8 are placed on it and wait), as Slurm's held jobs
#               do                                                | `sbatch --hold --wrap=true`
#   storm       LOOPS shell loops x PER_LOOP CLI submits at once, held as above
#                                                                 | the same with sbatch --hold
#   sweep       LOOPS x PER_LOOP jobs from one CLI call, held as above: `loomctl submit` with
#               a -f per spec (one connection, the calls overlapping; "nan" for a build without
#               it)                        | `sbatch --hold --array=1-N`: one array job of N
#               tasks, which Slurm stores as one record until its tasks are started
#   storm-run   Loom only: the storm with the worker running, so the jobs run (1 device each,
#               8 at a time) while the storm goes on
#   submit-tls, storm-tls   Loom only: submit and storm (held) against a loomd that serves TLS
#               and checks a bearer token on every call (scripts/dev-certs.sh), Loom's secure
#               configuration, with loomctl's defaults (since 3362811 a call soon after another
#               shares a connection: client/persist_mux.h, "Automatic"). Slurm's column repeats
#               its submit and storm figures there: its every call carries its default
#               authentication (munge)
#   submit-tls-direct, storm-tls-direct   the same with --persist=0: every call its own TLS
#               connection, which is what a call alone costs
#   submit-persist, storm-persist, submit-tls-persist, storm-tls-persist   Loom only: the same
#               with `loomctl --persist=60s` (a background loomctl keeps the connections to loomd
#               open; client/persist_mux.h), started by one call before the clock; "nan" for a
#               build without --persist. Slurm's column repeats its submit and storm figures
#               there, as for the TLS rows
#   turnaround  JOBS trivial 8-device jobs, all queued first (Loom: while the worker is stopped;
#               Slurm: held), then released: wall time per job from the release until the last
#               ends (each job takes every device, so they run one after the other) | the same
#               with `sbatch -n8 --wrap=true` on a one-node Slurm with 8 CPUs
#   gap         Loom only, from the turnaround jobs' events: one job SUCCEEDED -> the next one
#               RUNNING, for the next jobs already queued then ("from release")
#   placed      Loom only: the part of the gap until the next job is SCHEDULED
#   floor       printed under the table: the storm's loops running `/bin/true` instead of a
#               CLI, measured each round. No CLI-per-job system can beat it on this machine: it is
#               what the shell's forks and a process's own start and exit cost
#   cpu-loomd, cpu-worker, cpu-ranks   Loom only: CPU milliseconds per turnaround job spent by
#               loomd, by loom-worker, and by the rank processes (the worker's reaped
#               children, whose figure has the kernel's 10 ms tick as its grain)
# Loom runs loomd --insecure on loopback with one loom-worker of 8 CPU devices whose rank
# program is /bin/true (a rank that exits 0 at once). Each build's loomd, loom-worker and
# loomctl run from copies in the bench's temporary directory (why: below, at the copy).
#
# --setup-slurm: installs slurm-wlm and munge with apt-get (needs root) and writes a one-node
# slurm.conf for this host on loopback (8 CPUs, default scheduler settings), then starts munged,
# slurmctld and slurmd, and stops the ones it started when it ends. Without it, Slurm is measured
# only when `sinfo` already answers.
#
# Under the table: each row's figure per round (for the main rows), in the order measured.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=build/bin
base_bin=
rounds=3
loops=32
per_loop=32
serial=20
jobs=100
setup_slurm=0
for arg in "$@"; do
  case "$arg" in
    --bin=*) bin=${arg#*=} ;;
    --base-bin=*) base_bin=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --loops=*) loops=${arg#*=} ;;
    --per-loop=*) per_loop=${arg#*=} ;;
    --serial=*) serial=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --setup-slurm) setup_slurm=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d'
      exit 0
      ;;
    *)
      echo "control_plane_bench: unknown argument $arg (see --help)" >&2
      exit 2
      ;;
  esac
done
bin=$(realpath "$bin")
[ -n "$base_bin" ] && base_bin=$(realpath "$base_bin")
for b in "$bin" ${base_bin:+"$base_bin"}; do
  for tool in loomd loom-worker loomctl; do
    if [ ! -x "$b/$tool" ]; then
      echo "control_plane_bench: $b/$tool is missing; build the targets loomd, loom-worker and loomctl" >&2
      exit 2
    fi
  done
done

tmp=$(mktemp -d -t loom-cpbench-XXXXXX)
# A root worker runs ranks as nobody unless told otherwise; nobody cannot enter this private
# temp dir, and /bin/true needs no confinement.
rank_user=
[ "$(id -u)" = 0 ] && rank_user=root
pids=()
# The --persist rows' muxes keep their sockets here, and are ended with the daemons.
export XDG_RUNTIME_DIR=$tmp/run
mkdir -m 0700 "$XDG_RUNTIME_DIR"
kill_muxes() { pkill -f -- "--persist-mux $XDG_RUNTIME_DIR/" 2>/dev/null || true; }
# A stopped worker (the held rows) ends only once continued: SIGTERM waits for SIGCONT.
# The Slurm daemons --setup-slurm started are stopped at the end: slurmctld idles at about 5 % of
# a core here, which would fall on whatever is measured next.
started_slurm=()
cleanup() {
  kill_muxes
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && kill -CONT "$p" 2>/dev/null || true; done
  for d in "${started_slurm[@]}"; do pkill -x "$d" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${LOOM_BENCH_KEEP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"
}
trap cleanup EXIT

# Each build's programs are run from copies in $tmp, as an installation would run them. For a
# while on the machine of docs/benchmarks.md (2026-12-07, afternoon), `loomctl --help` ran
# 10-30 % longer from the file the linker wrote than from a `cp` of it, with the same page
# faults; an hour later the difference was gone, and its cause was not found. Fresh copies of
# both builds keep such a difference out of the comparison.
for side in loom base; do
  src=$bin
  [ "$side" = base ] && src=$base_bin
  [ -n "$src" ] || continue
  mkdir "$tmp/bin-$side"
  cp "$src/loomd" "$src/loom-worker" "$src/loomctl" "$tmp/bin-$side/"
  if [ "$side" = base ]; then base_bin=$tmp/bin-$side; else bin=$tmp/bin-$side; fi
done

now_ns() { date +%s%N; }
median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# ---- Slurm -----------------------------------------------------------------------------------
if [ "$setup_slurm" = 1 ]; then
  apt-get install -y -q slurm-wlm munge >/dev/null
  host=$(hostname -s)
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  cat >/etc/slurm/slurm.conf <<EOF
ClusterName=loombench
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
# The node is declared with 8 CPUs, like Loom's worker with 8 CPU devices, on whatever this
# machine has: slurmd must take the declared figures instead of marking the node invalid.
SlurmdParameters=config_overrides
# Room for the sweep row's array (the default allows indices up to 1000).
MaxArraySize=100001
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=bench Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  # munged refuses to run as root (its log and socket directories belong to the munge user),
  # and reads a key only its own user may read.
  [ -f /etc/munge/munge.key ] || mungekey --create >/dev/null 2>&1 || true
  mkdir -p /run/munge
  chown munge:munge /etc/munge/munge.key /run/munge
  pgrep -x munged >/dev/null || { runuser -u munge -- munged && started_slurm+=(munged); }
  # Restarted on the configuration just written, with a clean state (-c drops old jobs).
  pkill -x slurmctld || true
  pkill -x slurmd || true
  while pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; do sleep 0.1; done
  slurmctld -c
  slurmd
  started_slurm=(slurmd slurmctld "${started_slurm[@]}")
  for _ in $(seq 1 50); do sinfo -h >/dev/null 2>&1 && break; sleep 0.2; done
fi
have_slurm=0
if command -v sbatch >/dev/null 2>&1 && sinfo -h >/dev/null 2>&1; then have_slurm=1; fi

# ---- Loom ------------------------------------------------------------------------------------
# Starts loomd and one 8-device worker from build dir $1 under $tmp/$2; sets server=HOST:PORT
# and client_flags (what loomctl needs besides --server). With $3 = tls, loomd serves TLS with
# the development certificates and checks bearer tokens; the worker and loomctl use them.
start_loom() {
  local b=$1 dir=$tmp/$2 mode=${3:-plain}
  local daemon_flags=(--insecure) worker_flags=(--insecure)
  client_flags=()
  if [ "$mode" = tls ]; then
    [ -f "$tmp/certs/ca.pem" ] || bash scripts/dev-certs.sh "$tmp/certs" >/dev/null
    daemon_flags=(--tls-cert="$tmp/certs/loomd.pem" --tls-key="$tmp/certs/loomd.key"
      --tokens-file="$tmp/certs/tokens")
    worker_flags=(--tls-ca="$tmp/certs/ca.pem" --join-token-file="$tmp/certs/node.token")
    client_flags=(--tls-ca="$tmp/certs/ca.pem" --token-file="$tmp/certs/user.token")
  fi
  mkdir -p "$dir"
  "$b/loomd" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --state-dir="$dir/state" \
    --ready-file="$dir/loomd.ready" "${daemon_flags[@]}" >"$dir/loomd.log" 2>&1 &
  loomd_pid=$!
  pids+=($!)
  for _ in $(seq 1 100); do [ -s "$dir/loomd.ready" ] && break; sleep 0.05; done
  server=$(sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$dir/loomd.ready")
  "$b/loom-worker" --coordinator="$server" "${worker_flags[@]}" --cpu-devices=8 \
    --work-dir="$dir/work" --rank-program=/bin/true --name=bench-node \
    --ready-file="$dir/worker.ready" \
    ${rank_user:+--rank-user="$rank_user"} >"$dir/worker.log" 2>&1 &
  worker_pid=$!
  pids+=($!)
  for _ in $(seq 1 100); do [ -s "$dir/worker.ready" ] && break; sleep 0.05; done
}

stop_loom() {
  kill_muxes
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && kill -CONT "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

# Nanoseconds of CPU that process $1 has run, all its threads, also those that have ended (gRPC's
# sync server ends threads under load): its process CPU clock, whose id clock_getcpuclockid(3)
# would give, read with Python. Without python3, the live threads' /proc/PID/task/*/schedstat,
# which misses the ended ones.
cpu_ns() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c "import sys, time; print(time.clock_gettime_ns(((~int(sys.argv[1])) << 3) | 2))" \
      "$1" 2>/dev/null && return
  fi
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'
}
# Nanoseconds of CPU of process $1's reaped children (cutime + cstime, in clock ticks).
children_cpu_ns() {
  awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($16 + $17) * 1000000000 / hz}' /proc/"$1"/stat
}

spec() {  # a trivial job on $1 CPU devices
  printf 'name: bench\nmodel: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\nresources: {cpu_devices: %s}\n' "$1"
}

# Milliseconds per call of "$@", averaged over $serial calls.
per_call_ms() {
  local start end
  start=$(now_ns)
  for _ in $(seq 1 "$serial"); do "$@" >/dev/null 2>&1; done
  end=$(now_ns)
  echo "scale=2; ($end - $start) / $serial / 1000000" | bc
}

# Jobs per second of $loops parallel loops of $per_loop calls of "$@".
storm_rate() {
  local start end
  start=$(now_ns)
  for _ in $(seq 1 "$loops"); do
    (for _ in $(seq 1 "$per_loop"); do "$@" >/dev/null 2>&1; done) &
  done
  wait_children
  end=$(now_ns)
  echo "scale=1; $loops * $per_loop * 1000000000 / ($end - $start)" | bc
}
# Jobs per second of one call of "$@" that submits $loops * $per_loop jobs and prints a line per
# job; nan when it printed another count (a build whose submit takes one spec).
sweep_rate() {
  local n=$((loops * per_loop)) start end got
  start=$(now_ns)
  got=$("$@" 2>/dev/null | wc -l || true)
  end=$(now_ns)
  if [ "$got" != "$n" ]; then
    echo nan
    return
  fi
  echo "scale=1; $n * 1000000000 / ($end - $start)" | bc
}
# Slurm's sweep: one array job of $loops * $per_loop tasks.
slurm_sweep_rate() {
  local n=$((loops * per_loop)) start end
  start=$(now_ns)
  sbatch -Q --hold --array=1-"$n" --wrap=true -o /dev/null >/dev/null 2>&1 || {
    echo nan
    return
  }
  end=$(now_ns)
  echo "scale=1; $n * 1000000000 / ($end - $start)" | bc
}
wait_children() {  # waits for the storm loops only (not the daemons)
  local p
  for p in $(jobs -p); do
    if ! printf '%s\n' "${pids[@]}" | grep -qx "$p"; then wait "$p" || true; fi
  done
}

# Loom: wall milliseconds per job for $jobs 8-device jobs queued at once (on a fresh loomd).
loom_turnaround_ms() {
  local b=$1 start end last state
  spec 8 >"$tmp/spec8.yaml"
  # The queue is filled while the worker is stopped (the first job is placed on it and waits),
  # and the clock starts when it resumes: the submits' CPU does not fall on the gangs' starts.
  kill -STOP "$worker_pid"
  for _ in $(seq 1 "$jobs"); do
    "$b/loomctl" --server="$server" -o json submit -f "$tmp/spec8.yaml"
  done | sed -n 's/.*"name": *"\(jobs\/[^"]*\)".*/\1/p' >"$tmp/names"
  # FIFO and every job takes all 8 devices: the last one ends last. Its end is awaited on a
  # WatchJob stream (`loomctl watch`), opened before the clock starts: a watcher costs nothing
  # while it waits, where polling `loomctl get` every 10 ms took about a fifth of a core from
  # the gangs it timed (each call is a process of about 3 ms of CPU here).
  last=$(tail -1 "$tmp/names")
  "$b/loomctl" --server="$server" watch "$last" >"$tmp/watch.out" 2>&1 &
  local watcher=$!
  for _ in $(seq 1 500); do [ -s "$tmp/watch.out" ] && break; sleep 0.01; done
  local l0 w0 r0
  l0=$(cpu_ns "$loomd_pid")
  w0=$(cpu_ns "$worker_pid")
  r0=$(children_cpu_ns "$worker_pid")
  start=$(now_ns)
  kill -CONT "$worker_pid"
  wait "$watcher" || true
  end=$(now_ns)
  # Microseconds of CPU per job, for the cpu-* rows (the caller reads them from this file).
  echo "$((($(cpu_ns "$loomd_pid") - l0) / jobs / 1000))" \
    "$((($(cpu_ns "$worker_pid") - w0) / jobs / 1000))" \
    "$((($(children_cpu_ns "$worker_pid") - r0) / jobs / 1000))" >"$tmp/cpu_us"
  state=$("$b/loomctl" --server="$server" -o json get "$last" |
    sed -n 's/^  "state": *"\([A-Z]*\)".*/\1/p' | head -1)
  [ "$state" = SUCCEEDED ] || echo "control_plane_bench: the last job ended $state" >&2
  echo "scale=2; ($end - $start) / $jobs / 1000000" | bc
}

# Loom: from the events of the jobs of the last turnaround run, the median time from one job's
# SUCCEEDED to the next one's RUNNING, over the pairs where the next job was already queued
# (the "gap from release"), and the part of it until the next one was SCHEDULED.
loom_gap_ms() {
  local b=$1 name
  while read -r name; do
    "$b/loomctl" --server="$server" -o json get "$name"
    echo
  done <"$tmp/names" | python3 -c '
import datetime, json, statistics, sys
text, decoder, i, rows = sys.stdin.read(), json.JSONDecoder(), 0, []
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    job, i = decoder.raw_decode(text, i)
    rows.append({e["toState"]: datetime.datetime.fromisoformat(e["time"].rstrip("Z")[:26])
                 for e in job.get("events", [])})
gaps, placed = [], []
for a, b in zip(rows, rows[1:]):
    if "SUCCEEDED" in a and "RUNNING" in b and b["QUEUED"] < a["SUCCEEDED"]:
        gaps.append((b["RUNNING"] - a["SUCCEEDED"]).total_seconds() * 1e3)
        placed.append((b["SCHEDULED"] - a["SUCCEEDED"]).total_seconds() * 1e3)
print("%.2f %.2f" % (statistics.median(gaps), statistics.median(placed)) if gaps else "nan nan")
'
}

slurm_turnaround_ms() {
  local start end ids=()
  # Submitted held, and released at once when the clock starts (as Loom's queue is).
  for _ in $(seq 1 "$jobs"); do ids+=("$(sbatch --parsable --hold -n8 --wrap=true -o /dev/null)"); done
  start=$(now_ns)
  scontrol release "$(IFS=,; echo "${ids[*]}")"
  while [ -n "$(squeue -h -u "$(id -un)" 2>/dev/null)" ]; do sleep 0.01; done
  end=$(now_ns)
  echo "scale=2; ($end - $start) / $jobs / 1000000" | bc
}

declare -A results  # "system row" -> newline-separated values
record() { results["$1 $2"]+="$3"$'\n'; }

# The sweep's specs: a file each, as a sweep's generator writes them.
mkdir -p "$tmp/sweep"
sweep_files=()
for i in $(seq 1 $((loops * per_loop))); do
  spec 1 | sed "s/^name: bench/name: sweep-$i/" >"$tmp/sweep/s$i.yaml"
  sweep_files+=(-f "$tmp/sweep/s$i.yaml")
done

systems=(loom)
[ -n "$base_bin" ] && systems+=(base)
[ "$have_slurm" = 1 ] && systems+=(slurm)

for round in $(seq 1 "$rounds"); do
  record floor storm "$(storm_rate /bin/true)"
  # Every other round in the reverse order: what a system's rows leave behind (dirty pages, a
  # busy disk) then falls on each system's next rows alike.
  order=("${systems[@]}")
  if [ $((round % 2)) = 0 ]; then
    order=()
    for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[$i]}"); done
  fi
  for system in "${order[@]}"; do
    case "$system" in
      loom | base)
        b=$bin
        [ "$system" = base ] && b=$base_bin
        start_loom "$b" "$system-$round"
        spec 1 >"$tmp/spec1.yaml"
        submit=("$b/loomctl" --server="$server" submit -f "$tmp/spec1.yaml")
        record "$system" start "$(per_call_ms "$b/loomctl" --help)"
        # Submits of one device into an 8-device worker: with the worker running, most queue
        # behind each other and the rank program exits at once, so the queue drains as the
        # storm goes on. That is measured first; then the worker is stopped (held jobs).
        record "$system" storm-run "$(storm_rate "${submit[@]}")"
        kill -STOP "$worker_pid"
        record "$system" submit "$(per_call_ms "${submit[@]}")"
        record "$system" storm "$(storm_rate "${submit[@]}")"
        record "$system" sweep "$(sweep_rate "$b/loomctl" --server="$server" submit "${sweep_files[@]}")"
        kill -CONT "$worker_pid"
        stop_loom
        start_loom "$b" "$system-$round-tls" tls
        kill -STOP "$worker_pid"
        submit=("$b/loomctl" --server="$server" "${client_flags[@]}" submit -f "$tmp/spec1.yaml")
        # A failing call would be fast: check once that the secure configuration answers.
        "${submit[@]}" >/dev/null
        direct=("$b/loomctl" --server="$server" "${client_flags[@]}" --persist=0
          submit -f "$tmp/spec1.yaml")
        record "$system" submit-tls-direct "$(per_call_ms "${direct[@]}")"
        record "$system" storm-tls-direct "$(storm_rate "${direct[@]}")"
        record "$system" submit-tls "$(per_call_ms "${submit[@]}")"
        record "$system" storm-tls "$(storm_rate "${submit[@]}")"
        kill -CONT "$worker_pid"
        stop_loom
        # The --persist rows, each on a fresh loomd (plaintext, then TLS) with the worker stopped.
        for mode in plain tls; do
          start_loom "$b" "$system-$round-persist-$mode" "$mode"
          kill -STOP "$worker_pid"
          submit=("$b/loomctl" --server="$server" "${client_flags[@]}" --persist=60s
            submit -f "$tmp/spec1.yaml")
          suffix=-persist
          [ "$mode" = tls ] && suffix=-tls-persist
          # Starts the mux; a build without --persist fails here and gets nan.
          if "${submit[@]}" >/dev/null 2>&1; then
            record "$system" "submit$suffix" "$(per_call_ms "${submit[@]}")"
            record "$system" "storm$suffix" "$(storm_rate "${submit[@]}")"
          else
            record "$system" "submit$suffix" nan
            record "$system" "storm$suffix" nan
          fi
          kill -CONT "$worker_pid"
          stop_loom
        done
        start_loom "$b" "$system-$round-turnaround"
        record "$system" turnaround "$(loom_turnaround_ms "$b")"
        read -r cpu_loomd cpu_worker cpu_ranks <"$tmp/cpu_us"
        record "$system" cpu-loomd "$(echo "scale=2; $cpu_loomd / 1000" | bc)"
        record "$system" cpu-worker "$(echo "scale=2; $cpu_worker / 1000" | bc)"
        record "$system" cpu-ranks "$(echo "scale=2; $cpu_ranks / 1000" | bc)"
        read -r gap placed <<<"$(loom_gap_ms "$b")"
        record "$system" gap "$gap"
        record "$system" placed "$placed"
        stop_loom
        ;;
      slurm)
        record slurm start "$(per_call_ms sbatch --help)"
        record slurm submit "$(per_call_ms sbatch -Q --hold --wrap=true -o /dev/null)"
        scancel -u "$(id -un)" 2>/dev/null || true
        record slurm storm "$(storm_rate sbatch -Q --hold --wrap=true -o /dev/null)"
        scancel -u "$(id -un)" 2>/dev/null || true
        record slurm sweep "$(slurm_sweep_rate)"
        scancel -u "$(id -un)" 2>/dev/null || true
        record slurm turnaround "$(slurm_turnaround_ms)"
        ;;
    esac
  done
done

echo "control_plane_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $rounds rounds," \
  "storm $loops x $per_loop, turnaround $jobs jobs"
printf '%-18s %-8s' row unit
for system in "${systems[@]}"; do printf ' %-10s' "$system"; done
[ "${#systems[@]}" -gt 1 ] && for system in "${systems[@]:1}"; do printf ' %-12s' "loom/$system"; done
echo
for row in start submit submit-tls submit-tls-direct submit-persist submit-tls-persist storm \
  storm-tls storm-tls-direct storm-persist storm-tls-persist sweep storm-run turnaround gap \
  placed cpu-loomd cpu-worker cpu-ranks; do
  unit=ms
  [[ "$row" = storm* || "$row" = sweep ]] && unit=jobs/s
  printf '%-18s %-8s' "$row" "$unit"
  declare -A med=()
  for system in "${systems[@]}"; do
    values=${results["$system $row"]:-}
    # Slurm has no TLS or --persist rows: its every call carries munge authentication, so its
    # plain submit/storm figure stands beside Loom's secure and persistent ones.
    [ "$system" = slurm ] && [[ "$row" = *-tls || "$row" = *-persist || "$row" = *-direct ]] &&
      values=${results["slurm ${row%%-*}"]:-}
    med[$system]=$(printf '%s' "$values" | median)
    printf ' %-10s' "${med[$system]}"
  done
  if [ "${#systems[@]}" -gt 1 ]; then
    for system in "${systems[@]:1}"; do
      # The ratio says how many times better Loom is: rate / rate, or time / time inverted.
      if [ "${med[$system]}" = nan ] || [ "${med[loom]}" = nan ]; then
        ratio=-
      elif [[ "$row" = storm* || "$row" = sweep ]]; then
        ratio=$(echo "scale=2; ${med[loom]} / ${med[$system]}" | bc)
      else
        ratio=$(echo "scale=2; ${med[$system]} / ${med[loom]}" | bc)
      fi
      [ "$ratio" = - ] || ratio=${ratio}x
      printf ' %-12s' "$ratio"
    done
  fi
  echo
  unset med
done
# Every round's figure, in the order measured: how far apart the rounds were says how much of a
# ratio above is the machine's noise.
echo "rounds:"
for row in start submit submit-tls submit-tls-direct storm storm-tls storm-tls-direct \
  storm-persist storm-tls-persist turnaround gap cpu-ranks; do
  for system in "${systems[@]}"; do
    values=${results["$system $row"]:-}
    [ -n "$values" ] || continue
    printf '  %-18s %-6s %s\n' "$row" "$system" "$(printf '%s' "$values" | tr '\n' ' ')"
  done
done
floor=$(printf '%s' "${results["floor storm"]:-}" | median)
echo "floor: the storm's loops running /bin/true: $floor jobs/s (a CLI-per-job system's ceiling here)"
[ "$have_slurm" = 1 ] || echo "(Slurm not measured: sbatch/sinfo do not answer; see --setup-slurm)"
