#!/usr/bin/env python3
"""Checks deploy/k8s: every overlay renders (with the kubectl on PATH and, when given, Debian's
kubectl 1.20 with kustomize v2, to the same objects); every built-in object validates against
the Kubernetes schemas (kubernetes-validate, strict: unknown fields fail); the Prometheus
Operator objects, which have no built-in schema, validate against crd_schemas.py (the fields
these manifests use, nothing else allowed) and the rules through `promtool check rules`; the
generated rule and dashboard objects are up to date and equal their sources; every flag of the
rendered loomd, loom-worker and probe commands is one the program accepts; and the objects
agree with each other (selectors, ports, volumes, paths, addresses, images).

Run by k8s_manifests.sh, which makes the environment. Prints PASS/FAIL per check and a closing
`N passed, N failed` line; exit status 1 on any failure.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import crd_schemas  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["dev", "gpu"]
# The oldest Kubernetes the manifests are for (gRPC probes are GA from 1.27) and the newest the
# validator knows.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
CRD_KINDS = {"PodMonitor", "PrometheusRule"}
LOOM_PROGRAMS = {"loomd", "loom-worker"}
PROBE = "loom-health-probe"


class Failure(Exception):
    pass


def render(kubectl, target):
    result = subprocess.run([kubectl, "kustomize", str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(f"{kubectl} kustomize {target.relative_to(ROOT)}: {result.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    if not docs:
        raise Failure(f"{target.relative_to(ROOT)} rendered no objects")
    return docs


def obj_id(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def canonical(value):
    """Lists of named entries sorted by name: kustomize v2 and v5 merge patches into lists in
    different orders, which means nothing to Kubernetes for these lists."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [canonical(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            items.sort(key=lambda v: str(v["name"]))
        return items
    return value


def pod_specs(docs):
    """(workload id, pod spec, pod labels) of every StatefulSet, DaemonSet and Deployment."""
    for obj in docs:
        if obj["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            template = obj["spec"]["template"]
            yield obj_id(obj), template["spec"], template["metadata"].get("labels", {})


def containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def find(docs, kind, name=None):
    found = [d for d in docs
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if not found:
        raise Failure(f"no {kind}{'/' + name if name else ''} in the rendered objects")
    return found


def flag_values(container):
    """{--flag: value} of a container's args ("--flag=value" form)."""
    out = {}
    for arg in container.get("args", []):
        name, _, value = arg.partition("=")
        out[name] = value
    return out


# --- flags ---------------------------------------------------------------------------------------


def accepted_flags(program, bin_dir):
    if program == PROBE:
        cmd = [sys.executable, str(ROOT / "deploy" / "images" / PROBE), "--help"]
    else:
        cmd = [str(bin_dir / program), "--help"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise Failure(f"{cmd[0]} not found: build it first "
                      f"(cmake --build build --target {program})")
    if result.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()}")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", result.stdout))
    if len(flags) < 3:
        raise Failure(f"{' '.join(cmd)} listed no flags; cannot check against it")
    return flags


def bad_flags(argv, accepted):
    """The entries of argv (a command's arguments) that the program would not accept."""
    errors = []
    for arg in argv:
        if not arg.startswith("--"):
            errors.append(f"{arg!r} is not a --flag (every argument of these programs is one)")
            continue
        name = arg.partition("=")[0]
        if name not in accepted:
            errors.append(f"{name} is not a flag of the program")
        elif name == "--help":
            errors.append("--help would only print help")
    return errors


def check_flags(docs, bin_dir, cache):
    checked = 0
    for wid, spec, _ in pod_specs(docs):
        commands = []
        for c in containers(spec):
            commands.append((c["name"], c.get("command", []) + c.get("args", [])))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if "exec" in c.get(probe, {}):
                    commands.append((f"{c['name']} {probe}", c[probe]["exec"]["command"]))
        for where, argv in commands:
            program = os.path.basename(argv[0]) if argv else ""
            if program not in LOOM_PROGRAMS | {PROBE}:
                continue
            if program not in cache:
                cache[program] = accepted_flags(program, bin_dir)
            errors = bad_flags(argv[1:], cache[program])
            if errors:
                raise Failure(f"{wid} {where}: " + "; ".join(errors))
            checked += 1
    if checked < 3:
        raise Failure(f"only {checked} loomd/loom-worker/probe commands found")
    return checked


# --- validation ----------------------------------------------------------------------------------


def check_schemas(docs):
    for obj in docs:
        if obj["kind"] in CRD_KINDS:
            schema = crd_schemas.SCHEMAS[obj["kind"]]
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str)
            if errors:
                e = errors[0]
                raise Failure(f"{obj_id(obj)}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(map(str, e.path))
                raise Failure(f"{obj_id(obj)} (Kubernetes {version}): {path}: {e.message}")


def check_rules_with_promtool(rule):
    promtool = shutil.which("promtool")
    if promtool is None:
        raise Failure("promtool not on PATH (scripts/setup.sh installs Debian's prometheus)")
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
        f.flush()
        result = subprocess.run([promtool, "check", "rules", f.name], capture_output=True,
                                text=True)
    if result.returncode != 0:
        raise Failure("promtool check rules on PrometheusRule/loom: "
                      f"{result.stdout}{result.stderr}")


def check_generated(docs):
    result = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(result.stderr.strip() or result.stdout.strip())
    # The same content as the sources, checked independently of the generator's code.
    groups = []
    for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.y*ml")):
        groups += yaml.safe_load(path.read_text())["groups"]
    rule = find(docs, "PrometheusRule", "loom")[0]
    if rule["spec"]["groups"] != groups:
        raise Failure("PrometheusRule/loom's groups differ from deploy/prometheus/rules")
    check_rules_with_promtool(rule)
    dashboards = {p.name: p.read_text()
                  for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    found = {}
    for cm in docs:
        if cm["kind"] == "ConfigMap" and cm["metadata"].get("labels", {}).get(
                "grafana_dashboard") == "1":
            found.update(cm.get("data", {}))
    if found != dashboards:
        raise Failure(f"dashboard ConfigMaps hold {sorted(found)}, the files are "
                      f"{sorted(dashboards)} (or their contents differ)")


# --- consistency ---------------------------------------------------------------------------------


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_consistency(docs, overlay, expected_images):
    workloads = list(pod_specs(docs))
    names = {obj_id(d) for d in docs}
    for svc in find(docs, "Service"):
        sel = svc["spec"]["selector"]
        pods = [(w, s) for w, s, labels in workloads if selects(sel, labels)]
        if not pods:
            raise Failure(f"{obj_id(svc)} selects no pods")
        ports = {p["name"] for _, s in pods for c in s["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            if port["targetPort"] not in ports:
                raise Failure(f"{obj_id(svc)} targets port {port['targetPort']!r}, not a port of "
                              f"{pods[0][0]}")
    jobs = set()
    for pm in find(docs, "PodMonitor"):
        sel = pm["spec"]["selector"]["matchLabels"]
        pods = [s for _, s, labels in workloads if selects(sel, labels)]
        if not pods:
            raise Failure(f"{obj_id(pm)} selects no pods")
        # The scrape job is named by the pods' jobLabel (else namespace/name, which the rules'
        # and dashboards' `up{job=...}` would not match); Loom's own `job` label must win.
        job_label = pm["spec"].get("jobLabel")
        jobs |= {labels.get(job_label) for _, _, labels in workloads if selects(sel, labels)}
        if any(not ep.get("honorLabels") for ep in pm["spec"]["podMetricsEndpoints"]):
            raise Failure(f"{obj_id(pm)}: every endpoint needs honorLabels: true (Loom's series "
                          "carry their own `job` label)")
        ports = {p["name"] for s in pods for c in s["containers"] for p in c.get("ports", [])}
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ep["port"] not in ports:
                raise Failure(f"{obj_id(pm)} scrapes port {ep['port']!r}, which the pods lack")
    want_jobs = scrape_job_names()
    if jobs != want_jobs:
        raise Failure(f"the PodMonitors name their scrape jobs {sorted(map(str, jobs))}, "
                      f"the alert rules and dashboards expect {sorted(want_jobs)}")
    for pdb in find(docs, "PodDisruptionBudget"):
        if not any(selects(pdb["spec"]["selector"]["matchLabels"], l) for _, _, l in workloads):
            raise Failure(f"{obj_id(pdb)} selects no pods")

    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for wid, spec, _ in workloads:
        if f"ServiceAccount/{spec.get('serviceAccountName')}" not in names:
            raise Failure(f"{wid}: serviceAccountName {spec.get('serviceAccountName')} is missing")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = set()
        for d in docs:
            if obj_id(d) == wid:
                templates = {t["metadata"]["name"]
                             for t in d["spec"].get("volumeClaimTemplates", [])}
        for c in containers(spec):
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes and m["name"] not in templates:
                    raise Failure(f"{wid} {c['name']} mounts {m['name']!r}, which is no volume")
        for v in volumes.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in claims:
                raise Failure(f"{wid}: volume {v['name']} claims {claim}, which is not defined")
        # The files the init container installs are the ones the programs are given.
        installed = set()
        for c in spec.get("initContainers", []):
            cmd = c.get("command", [])
            if cmd[:1] == ["install"] and "-t" in cmd:
                target = cmd[cmd.index("-t") + 1]
                installed |= {f"{target}/{os.path.basename(a)}"
                              for a in cmd[cmd.index("-t") + 2:]}
        for c in spec["containers"]:
            for flag, value in flag_values(c).items():
                if value.startswith("/run/loom/secrets/") and value not in installed:
                    raise Failure(f"{wid}: {flag}={value} is not installed by the init container")

    loomd = find(docs, "StatefulSet", "loomd")[0]["spec"]["template"]["spec"]
    worker_ds = find(docs, "DaemonSet", "loom-worker")[0]
    worker = worker_ds["spec"]["template"]["spec"]
    loomd_flags = flag_values(loomd["containers"][0])
    worker_flags = flag_values(worker["containers"][0])
    # Checkpoints: one path, the shared volume's mount on the workers.
    roots = loomd_flags.get("--checkpoint-roots")
    if not roots or roots != worker_flags.get("--checkpoint-roots"):
        raise Failure(f"loomd --checkpoint-roots={roots} but the worker's is "
                      f"{worker_flags.get('--checkpoint-roots')}")
    mounts = {m["mountPath"]: m["name"] for m in worker["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v for v in worker["volumes"]}
    claim = vols.get(mounts.get(roots), {}).get("persistentVolumeClaim", {}).get("claimName")
    if not claim:
        raise Failure(f"the worker's --checkpoint-roots={roots} is not a claim's mount")
    pvc = find(docs, "PersistentVolumeClaim", claim)[0]
    want_mode = "ReadWriteOnce" if overlay == "dev" else "ReadWriteMany"
    if pvc["spec"]["accessModes"] != [want_mode]:
        raise Failure(f"PersistentVolumeClaim/{claim} is {pvc['spec']['accessModes']}, "
                      f"want {want_mode}")
    # Addresses: workers and ranks dial the loomd Service by its cluster DNS name.
    svc = find(docs, "Service", "loomd")[0]
    grpc_port = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"][0]
    address = f"loomd.{svc['metadata']['namespace']}.svc:{grpc_port}"
    if worker_flags.get("--coordinator") != address or loomd_flags.get("--advertise") != address:
        raise Failure(f"worker --coordinator={worker_flags.get('--coordinator')} and loomd "
                      f"--advertise={loomd_flags.get('--advertise')} must both be {address}")
    # Node agent settings NCCL and the ranks rely on.
    if not worker.get("hostNetwork") or worker.get("dnsPolicy") != "ClusterFirstWithHostNet":
        raise Failure("the worker needs hostNetwork with dnsPolicy ClusterFirstWithHostNet")
    shm = vols.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
    if shm.get("medium") != "Memory":
        raise Failure("the worker's /dev/shm is not a memory-backed emptyDir")
    limits = worker["containers"][0].get("resources", {}).get("limits", {})
    if overlay == "gpu":
        if "nvidia.com/gpu" not in limits or not worker.get("nodeSelector") or not worker.get(
                "tolerations"):
            raise Failure("gpu overlay: the worker needs nvidia.com/gpu limits, a node selector "
                          "and tolerations")
    elif "nvidia.com/gpu" in limits or "--cpu-devices" not in worker_flags:
        raise Failure(f"{overlay} overlay: the worker gets CPU devices and no GPUs")
    # Images: the names and tags of deploy/images/images.env.
    worker_image = expected_images["LOOM_WORKER_CUDA_IMAGE" if overlay == "gpu" else
                                   "LOOM_WORKER_IMAGE"]
    for wid, spec, _ in workloads:
        want = expected_images["LOOMD_IMAGE"] if "loomd" in wid else worker_image
        for c in containers(spec):
            if c["image"] != want:
                raise Failure(f"{wid} {c['name']}: image {c['image']}, deploy/images/images.env "
                              f"says {want}")


def scrape_job_names():
    """loomd and loom-worker: the scrape jobs the alert rules and dashboards are written against
    (`up{job="loomd"}`); deploy/prometheus/prometheus.yml, where it exists, must name them."""
    want = {"loomd", "loom-worker"}
    path = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    if path.exists():
        config = yaml.safe_load(path.read_text())
        names = {c.get("job_name") for c in config.get("scrape_configs", [])}
        if not want <= names:
            raise Failure(f"{path.relative_to(ROOT)} has scrape jobs {sorted(map(str, names))}, "
                          f"not {sorted(want)}")
    return want


def expected_images():
    env = {}
    for line in (ROOT / "deploy" / "images" / "images.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    tag = env["LOOM_IMAGE_TAG"]
    return {k: f"{v}:{tag}" for k, v in env.items() if k.endswith("_IMAGE")}


# --- self checks: each check above can fail ------------------------------------------------------


def check_the_checks(docs, bin_dir, cache):
    """The checks must catch what they are for: a misspelt flag, an unknown field, a CRD field
    the schema does not know, an object that lost its partner."""
    accepted = cache.get("loomd") or accepted_flags("loomd", bin_dir)
    if not bad_flags(["--chekpoint-roots=/x"], accepted):
        raise Failure("a misspelt loomd flag was not caught")
    if bad_flags(["--checkpoint-roots=/x"], accepted):
        raise Failure("a correct loomd flag was refused")
    sts = json.loads(json.dumps(find(docs, "StatefulSet", "loomd")[0]))
    sts["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    try:
        kubernetes_validate.validate(sts, KUBERNETES_VERSIONS[0], strict=True)
        raise Failure("an unknown field (livenessprobe) passed the Kubernetes schema")
    except kubernetes_validate.ValidationError:
        pass
    pm = json.loads(json.dumps(find(docs, "PodMonitor")[0]))
    pm["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    if jsonschema.Draft7Validator(crd_schemas.SCHEMAS["PodMonitor"]).is_valid(pm):
        raise Failure("an unknown PodMonitor field (prot) passed its schema")
    broken = [d for d in docs if d["kind"] != "ServiceAccount"]
    try:
        check_consistency(broken, "dev", expected_images())
        raise Failure("a missing ServiceAccount was not caught")
    except Failure as e:
        if "serviceAccountName" not in str(e):
            raise


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", type=pathlib.Path, default=ROOT / "build" / "bin")
    parser.add_argument("--old-kubectl", help="Debian 12's kubectl (kustomize v2), compared too")
    args = parser.parse_args()
    passed = failed = 0

    def run(name, fn):
        nonlocal passed, failed
        try:
            note = fn()
            print(f"PASS {name}" + (f" ({note})" if note else ""))
            passed += 1
        except Failure as e:
            print(f"FAIL {name}: {e}")
            failed += 1

    rendered, cache, images = {}, {}, expected_images()

    def render_one(overlay):
        docs = render("kubectl", K8S / "overlays" / overlay)
        rendered[overlay] = docs
        if args.old_kubectl:
            old = render(args.old_kubectl, K8S / "overlays" / overlay)
            new_set = {obj_id(d): canonical(d) for d in docs}
            old_set = {obj_id(d): canonical(d) for d in old}
            if new_set != old_set:
                diff = sorted(k for k in new_set.keys() | old_set.keys()
                              if new_set.get(k) != old_set.get(k))
                raise Failure(f"kubectl on PATH and {args.old_kubectl} render differently: {diff}")
            return f"{len(docs)} objects, same with kustomize v2"
        return f"{len(docs)} objects"

    run("base renders", lambda: f"{len(render('kubectl', K8S / 'base'))} objects")
    for overlay in OVERLAYS:
        run(f"{overlay}: renders", lambda o=overlay: render_one(o))
        if overlay not in rendered:
            continue
        docs = rendered[overlay]
        run(f"{overlay}: objects validate (Kubernetes {', '.join(KUBERNETES_VERSIONS)}; "
            "CRDs against tests/deploy/crd_schemas.py)", lambda d=docs: check_schemas(d))
        run(f"{overlay}: loomd, loom-worker and probe flags are accepted",
            lambda d=docs: f"{check_flags(d, args.bin, cache)} commands")
        run(f"{overlay}: objects agree with each other",
            lambda d=docs, o=overlay: check_consistency(d, o, images))
    if "dev" in rendered:
        run("generated rules and dashboards are up to date and equal their sources",
            lambda: check_generated(rendered["dev"]))
        run("the checks catch what they are for",
            lambda: check_the_checks(rendered["dev"], args.bin, cache))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
