#!/usr/bin/env python3
"""Every panel query of deploy/grafana/dashboards/*.json returns data from a real Prometheus.

Starts a local cluster (deploy/local/cluster.sh with LOOM_PROMETHEUS=1: loomd, two workers of
four CPU devices, and Debian's Prometheus scraping them every second with deploy/prometheus's
configuration and alert rules), runs a short scaling sweep, submits three jobs (a pipeline, one
the planner lays out, and one whose rank plays a GPU rank's telemetry on a third worker), and,
while they run, evaluates every panel's query and every template variable's query through
Prometheus's HTTP API with the dashboard's variables bound to the jobs. A query that Prometheus
rejects fails the test; so does one that returns nothing (MAY_BE_EMPTY would list exceptions,
with the reason; it is empty), or one that names a metric loomd and loom-worker do not export
(found in their sources). It also checks that Prometheus loaded every alert rule and evaluates
each without error.

Usage: tests/monitoring/dashboard_test.py [--keep]   (from the repository root; build/bin built)
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LOOM_BIN", os.path.join(ROOT, "build", "bin"))
DASHBOARDS = os.path.join(ROOT, "deploy", "grafana", "dashboards")
RULES = os.path.join(ROOT, "deploy", "prometheus", "rules")

# (dashboard uid, panel title, refId) -> why it may be empty. Nothing today: the GPU-only series
# come from a rank that plays a GPU rank (below).
MAY_BE_EMPTY = {}

# A short scaling sweep first (1 and 2 devices, 4 steps each), for the scaling panel.
SWEEP = """name: dashboard-sweep
model: {preset: tiny}
data: {builtin: tiny-corpus}
train: {steps: 100, lr: 3.0e-3}
resources: {cpu_devices: 1}
"""

# Then two jobs of four devices each, so that every panel has a job to show: a pipeline (data 2 x
# pipeline 2: bubbles, stage imbalance, data-parallel peers for the straggler score) and one the
# planner lays out (`auto`: a plan, hence a predicted step time and the MFU).
SPECS = ["""name: dashboard-pipeline
model: {preset: tiny}
data: {builtin: tiny-corpus}
train: {steps: 100000, global_batch_tokens: 1024, lr: 3.0e-3, warmup_steps: 20}
resources: {cpu_devices: 4}
parallelism: {data: 2, tensor: 1, pipeline: 2, micro_batch: 2, schedule: 1f1b,
              blocks_per_stage: [1, 1]}
checkpoint: {every_steps: 100000, dir: /tmp/loom-checkpoints}
""", """name: dashboard-auto
model: {preset: tiny}
data: {builtin: tiny-corpus}
train: {steps: 100000, lr: 3.0e-3, warmup_steps: 20}
resources: {cpu_devices: 4}
parallelism: {auto: {}}
"""]

# Last, a job whose rank plays a GPU rank's telemetry (test_rank with TEST_RANK_DEVICE: the
# memory figures a CUDA rank reports), on a third worker whose rank program is test_rank; this
# machine has no GPU, and the loom_gpu_* series exist only for ranks that report from one.
GPU_ROLE_SPEC = """name: dashboard-gpu-role
model: {preset: tiny}
data: {builtin: tiny-corpus}
train: {steps: 100000}
resources: {cpu_devices: 1}
env: {TEST_RANK_DEVICE: "cuda:0", TEST_RANK_STEPS: "100000", TEST_RANK_STEP_MS: "200",
      TEST_RANK_OUT_DIR: "%s"}
"""


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def query(prom, expr):
    """Returns (ok, result list or error text) of an instant query."""
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        return False, e.read().decode(errors="replace")
    if body.get("status") != "success":
        return False, json.dumps(body)
    return True, body["data"]["result"]


def exported_names():
    """Every loom_* metric name written in loomd's and loom-worker's sources."""
    names = set()
    for folder in ("server", "worker/agent", "common"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith((".cc", ".h")):
                    with open(os.path.join(dirpath, f), errors="replace") as fh:
                        names.update(re.findall(r'"(loom_[a-z0-9_]+)"', fh.read()))
    return names


def metric_names(expr):
    names = set(re.findall(r"\b(loom_[a-z0-9_]+)", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count"))
            and not n.endswith("_total") else n for n in names}


def bind(expr, jobs):
    """The query as Grafana sends it with $job = every job of `jobs` and $rank = All."""
    return (expr.replace("$__rate_interval", "30s").replace("$__interval", "5s")
            .replace('"$job"', '"%s"' % "|".join(jobs)).replace('"$rank"', '".*"'))


def checks(jobs):
    """(label, expr, may_be_empty_reason) for every variable and panel target."""
    out = []
    for f in sorted(os.listdir(DASHBOARDS)):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(DASHBOARDS, f)) as fh:
            d = json.load(fh)
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            if not m:
                fail("%s variable %s: only label_values(SERIES, LABEL) is checked" % (f, v["name"]))
            out.append(("%s variable $%s" % (d["uid"], v["name"]), bind(m.group(1), jobs), None))
        panels = []
        for p in d["panels"]:
            panels.append(p)
            panels.extend(p.get("panels", []))
        for p in panels:
            for t in p.get("targets", []):
                key = (d["uid"], p["title"], t["refId"])
                out.append(("%s / %s / %s" % key, bind(t["expr"], jobs), MAY_BE_EMPTY.get(key)))
    return out


def main():
    keep = "--keep" in sys.argv
    run = os.path.join(ROOT, ".cache", "dashboard-check")
    # The workers' device measurement at start (seconds, longer on a busy machine) is not what
    # this checks; the `auto` job is then planned from the catalog's figures.
    env = dict(os.environ, LOOM_PROMETHEUS="1", LOOM_WORKER_FLAGS="--measure-devices=0")
    cluster = os.path.join(ROOT, "deploy", "local", "cluster.sh")
    subprocess.run([cluster, "up", run, "2", "4"], env=env, check=True)
    try:
        cluster_env = {}
        with open(os.path.join(run, "env")) as fh:
            for line in fh:
                for part in line.replace("export ", "").split():
                    k, _, v = part.partition("=")
                    cluster_env[k] = v
        prom = cluster_env["LOOM_PROMETHEUS_URL"]
        env.update(cluster_env)
        sweep = os.path.join(run, "dashboard-sweep.yaml")
        with open(sweep, "w") as fh:
            fh.write(SWEEP)
        subprocess.run([os.path.join(BIN, "loomctl"), "scale-test", "-f", sweep, "--devices",
                        "1,2", "--steps", "4"], env=env, check=True)
        names = []
        try:
            for i, text in enumerate(SPECS):
                spec = os.path.join(run, "dashboard-check-%d.yaml" % i)
                with open(spec, "w") as fh:
                    fh.write(text)
                out = subprocess.run(
                    [os.path.join(BIN, "loomctl"), "submit", "-f", spec, "-o", "json"], env=env,
                    check=True, capture_output=True, text=True).stdout
                names.append(json.loads(out)["name"])
                print("submitted", names[-1])
            wait_running(env, names)
            gpu_worker = start_gpu_role_worker(run, cluster_env)
            try:
                spec = os.path.join(run, "dashboard-gpu-role.yaml")
                out_dir = os.path.join(run, "gpu-role-out")
                os.makedirs(out_dir, exist_ok=True)
                os.chmod(out_dir, 0o777)
                with open(spec, "w") as fh:
                    fh.write(GPU_ROLE_SPEC % out_dir)
                out = subprocess.run(
                    [os.path.join(BIN, "loomctl"), "submit", "-f", spec, "-o", "json"], env=env,
                    check=True, capture_output=True, text=True).stdout
                names.append(json.loads(out)["name"])
                print("submitted", names[-1], "(a GPU rank's telemetry, played by test_rank)")
                wait_running(env, names[-1:])
                run_checks(prom, [n.split("/", 1)[1] for n in names])
            finally:
                gpu_worker.terminate()
                gpu_worker.wait(timeout=30)
        finally:
            for name in names:
                subprocess.run([os.path.join(BIN, "loomctl"), "cancel", name], env=env,
                               capture_output=True)
    finally:
        if not keep:
            subprocess.run([cluster, "down", run])


def wait_running(env, names, seconds=120):
    """Waits until every job of `names` is RUNNING (so that the next job gets the free devices)."""
    deadline = time.time() + seconds
    for name in names:
        while True:
            out = subprocess.run([os.path.join(BIN, "loomctl"), "get", name, "-o", "json"],
                                 env=env, capture_output=True, text=True).stdout
            state = json.loads(out).get("state") if out.strip() else None
            if state == "RUNNING":
                break
            if state in ("FAILED", "CANCELLED", "SUCCEEDED") or time.time() > deadline:
                fail("%s is %s, not RUNNING" % (name, state))
            time.sleep(0.5)


def start_gpu_role_worker(run, cluster_env):
    """A third worker with one CPU device whose rank program is test_rank."""
    test_rank = os.path.join(os.path.dirname(BIN), "tests", "test_rank")
    if not os.access(test_rank, os.X_OK):
        fail("%s is missing (it is built with the tests)" % test_rank)
    certs = os.path.join(run, "certs")
    ready = os.path.join(run, "gpu-role.ready")
    if os.path.exists(ready):
        os.remove(ready)
    args = [os.path.join(BIN, "loom-worker"), "--coordinator=" + cluster_env["LOOM_SERVER"],
            "--name=gpu-role", "--cpu-devices=1", "--rank-program=" + test_rank,
            "--measure-devices=0", "--work-dir=" + os.path.join(run, "gpu-role"),
            "--ready-file=" + ready, "--checkpoint-roots=/tmp/loom-checkpoints",
            "--tls-ca=" + os.path.join(certs, "ca.pem"),
            "--join-token-file=" + os.path.join(certs, "node.token")]
    if os.getuid() == 0:
        args.append("--rank-user=root")  # test_rank lives in the build tree, private to root
    log = open(os.path.join(run, "gpu-role.log"), "w")
    worker = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while not (os.path.exists(ready) and os.path.getsize(ready) > 0):
        if worker.poll() is not None or time.time() > deadline:
            fail("the GPU-role worker did not start; see %s" % log.name)
        time.sleep(0.1)
    return worker


def run_checks(prom, jobs):
    known = exported_names()
    items = checks(jobs)
    for label, expr, _ in items:
        unknown = {n for n in metric_names(expr) if n not in known}
        if unknown:
            fail("%s: %s not exported by loomd or loom-worker: %s" % (label, sorted(unknown), expr))
    # The doctor's series need a few windows of steps; wait until every query that must return
    # data does, at most 150 s (the job trains for much longer).
    deadline = time.time() + 150
    while True:
        empty, invalid = [], []
        for label, expr, reason in items:
            ok, result = query(prom, expr)
            if not ok:
                invalid.append("%s: %s\n    %s" % (label, expr, result))
            elif not result and reason is None:
                empty.append("%s: %s" % (label, expr))
        if invalid:
            fail("queries Prometheus rejects:\n  " + "\n  ".join(invalid))
        if not empty:
            break
        if time.time() > deadline:
            fail("queries that return nothing:\n  " + "\n  ".join(empty))
        time.sleep(3)
    print("%d dashboard queries valid, %d returned data (%d allowed empty: %s)" % (
        len(items), sum(1 for i in items if i[2] is None), sum(1 for i in items if i[2]),
        "; ".join(sorted({i[2] for i in items if i[2]}))))
    with urllib.request.urlopen(prom + "/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    rules = [rule for g in groups for rule in g["rules"]]
    expected = sum(open(os.path.join(RULES, f)).read().count("- alert:")
                   for f in os.listdir(RULES) if f.endswith(".yml"))
    if len(rules) != expected or expected == 0:
        fail("Prometheus loaded %d alert rules, the rule files have %d" % (len(rules), expected))
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    if bad:
        fail("alert rules that do not evaluate: %s" % bad)
    print("%d alert rules loaded and evaluating" % len(rules))
    print("PASS")


if __name__ == "__main__":
    main()
