#!/usr/bin/env python3
"""Runs the pods of a rendered Kubernetes overlay with podman, the way a kubelet would, closely
enough to test the manifests and the images together: init containers first, then the
container with the rendered command, args and environment ($(VAR) expanded, status.podIP is
127.0.0.1), the pod's user and group, capabilities, read-only root file system, and its volumes
(emptyDir and PersistentVolumeClaims as directories owned by the pod's fsGroup, Secrets as
directories of root-owned files with the Secret's defaultMode); then its exec and gRPC probes.
Every pod uses the host network, and the cluster DNS name of a Service resolves to 127.0.0.1.

Used by deploy/images/check.sh --manifests; not a general tool. Usage:
  run_pods.py RENDERED.yaml WORKDIR IMAGE_MAP SECRETS_DIR
IMAGE_MAP: comma-separated NAME=LOCAL (rendered image name to the local podman image).
SECRETS_DIR: one directory per Secret name, one file per key.
Prints the names of the containers it started (to stop them); exit 1 when a pod does not start
or its probes do not pass within a minute.
"""

import os
import re
import shutil
import subprocess
import sys
import time

import yaml

PODMAN = ["podman", "--runtime", "runc"]


def log(msg):
    print(f"run_pods: {msg}", file=sys.stderr, flush=True)


def expand(value, env):
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                  value)


def container_env(c):
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in ("status.podIP",
                                                                             "status.hostIP"):
            env[e["name"]] = "127.0.0.1"
        else:
            raise SystemExit(f"run_pods: env {e['name']}: only values and podIP are emulated")
    return env


def prepare_volumes(name, spec, claim_templates, workdir, secrets_dir):
    """Host directories for the pod's volumes: {volume name: host path}."""
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    paths = {}
    volumes = list(spec.get("volumes", [])) + [
        {"name": t["metadata"]["name"], "persistentVolumeClaim": {}} for t in claim_templates]
    for v in volumes:
        path = os.path.join(workdir, name, v["name"])
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        if "secret" in v:
            src = os.path.join(secrets_dir, v["secret"]["secretName"])
            if not os.path.isdir(src):
                raise SystemExit(f"run_pods: {name}: Secret {v['secret']['secretName']} missing "
                                 f"(no {src})")
            mode = v["secret"].get("defaultMode", 0o644)
            for key in os.listdir(src):
                shutil.copy(os.path.join(src, key), os.path.join(path, key))
                os.chown(os.path.join(path, key), 0, fs_group if fs_group is not None else 0)
                os.chmod(os.path.join(path, key), mode)
        elif "emptyDir" in v or "persistentVolumeClaim" in v:
            # The kubelet gives these to the pod's fsGroup, group-writable with setgid.
            if fs_group is not None:
                os.chown(path, 0, fs_group)
                os.chmod(path, 0o2775)
            else:
                os.chmod(path, 0o777)
        else:
            raise SystemExit(f"run_pods: {name}: volume {v['name']}: kind not emulated")
        paths[v["name"]] = path
    return paths


def podman_args(pod, c, spec, volumes, hosts, detach):
    sc = dict(spec.get("securityContext", {}))
    sc.update(c.get("securityContext", {}))
    args = ["run", "--network=host", "--name", f"pods-{pod}-{c['name']}"]
    args += ["-d"] if detach else ["--rm"]
    for host in hosts:
        args += ["--add-host", f"{host}:127.0.0.1"]
    user = sc.get("runAsUser")
    if user is not None:
        args += ["--user", f"{user}:{sc.get('runAsGroup', user)}"]
    if "fsGroup" in spec.get("securityContext", {}):
        args += ["--group-add", str(spec["securityContext"]["fsGroup"])]
    caps = sc.get("capabilities", {})
    for cap in caps.get("drop", []):
        args += ["--cap-drop", cap]
    for cap in caps.get("add", []):
        args += ["--cap-add", cap]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    for m in c.get("volumeMounts", []):
        args += ["-v", f"{volumes[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"]
    env = container_env(c)
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    command = [expand(a, env) for a in c.get("command", [])]
    rest = [expand(a, env) for a in c.get("args", [])]
    if command:
        args += ["--entrypoint", command[0]]
    return args, command[1:] + rest


def probe_ok(pod, c, probe):
    if "exec" in probe:
        cmd = PODMAN + ["exec", f"pods-{pod}-{c['name']}"] + probe["exec"]["command"]
    elif "grpc" in probe:
        # The kubelet's gRPC probe: a plaintext grpc.health.v1 Check of the pod's port. The
        # worker image has no probe program (a kubelet brings its own), so loom-health-probe
        # --insecure from the loomd pod makes the same call (host network: the same address).
        cmd = PODMAN + ["exec", "pods-loomd-loomd", "/opt/loom/bin/loom-health-probe",
                        "--insecure", f"--addr=127.0.0.1:{probe['grpc']['port']}"]
    else:
        raise SystemExit(f"run_pods: {pod}: probe kind not emulated: {sorted(probe)}")
    return subprocess.run(cmd, capture_output=True).returncode == 0


def main(argv):
    rendered, workdir, image_map, secrets_dir = argv
    images = dict(kv.split("=", 1) for kv in image_map.split(","))
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    hosts = [f"{d['metadata']['name']}.{d['metadata']['namespace']}.svc" for d in docs
             if d["kind"] == "Service"]
    started = []
    for kind in ("StatefulSet", "DaemonSet"):
        for obj in (d for d in docs if d["kind"] == kind):
            pod = obj["metadata"]["name"]
            spec = obj["spec"]["template"]["spec"]
            volumes = prepare_volumes(pod, spec, obj["spec"].get("volumeClaimTemplates", []),
                                      workdir, secrets_dir)
            for c in spec.get("initContainers", []):
                args, rest = podman_args(pod, c, spec, volumes, hosts, detach=False)
                result = subprocess.run(PODMAN + args + [images[c["image"]]] + rest,
                                        capture_output=True, text=True)
                if result.returncode != 0:
                    log(f"{pod}: init container {c['name']} failed: {result.stderr.strip()}")
                    return 1
                log(f"{pod}: init container {c['name']} done")
            for c in spec["containers"]:
                args, rest = podman_args(pod, c, spec, volumes, hosts, detach=True)
                result = subprocess.run(PODMAN + args + [images[c["image"]]] + rest,
                                        capture_output=True, text=True)
                if result.returncode != 0:
                    log(f"{pod}: container {c['name']} did not start: {result.stderr.strip()}")
                    return 1
                started.append(f"pods-{pod}-{c['name']}")
                print(f"pods-{pod}-{c['name']}", flush=True)
                for kind_probe in ("readinessProbe", "livenessProbe"):
                    probe = c.get(kind_probe)
                    if not probe:
                        continue
                    deadline = time.time() + 60
                    while not probe_ok(pod, c, probe):
                        if time.time() > deadline:
                            logs = subprocess.run(PODMAN + ["logs", started[-1]],
                                                  capture_output=True, text=True)
                            log(f"{pod}: {kind_probe} failed for a minute:\n{logs.stderr[-2000:]}")
                            return 1
                        time.sleep(1)
                    log(f"{pod}: {c['name']} {kind_probe} passes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
