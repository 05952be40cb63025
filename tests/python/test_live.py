"""The client against a live local cluster (tests/python/run.sh starts it, with TLS and tokens):
every call of loom.Client, and the ten-line example script training the demo job.

The example runs in the background from the first test on (it needs about a worker's time for
the whole module); the tests that need its finished job come last."""

import math
import os
import re
import subprocess
import sys
import time

import grpc
import pytest

import loom
from conftest import REPO_ROOT, demo_dict

# A job that stays busy until it is cancelled.
LONG_STEPS = 1_000_000


@pytest.fixture(scope="module")
def demo_script(client):
    """The example script, started once; its output is read by test_example_script_*."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "client/python/examples/train_demo.py")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_example_script_starts(demo_script):
    # Started first so that its job gets a device before the others.
    time.sleep(1)
    assert demo_script.poll() in (None, 0)


def test_invalid_spec_raises_invalid_argument_naming_the_field(client):
    with pytest.raises(loom.InvalidArgument) as e:
        client.submit(demo_dict(steps=0))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.field == "spec.train.steps"
    assert "must be > 0" in e.value.message
    with pytest.raises(loom.InvalidArgument) as e:  # refused by the client, before any call
        client.submit({**demo_dict(), "resourcez": {"cpu_devices": 1}})
    assert e.value.field == "spec.resourcez"


def test_get_of_a_missing_job_raises_not_found(client):
    with pytest.raises(loom.NotFound) as e:
        client.get("no-such-job")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(loom.NotFound):
        client.report("jobs/no-such-job")
    with pytest.raises(loom.NotFound):
        client.cancel("no-such-job")


def test_a_wrong_token_is_unauthenticated(client):
    ca = os.environ["LOOM_TLS_CA"]
    with loom.Client(ca=ca, token="not-a-valid-token") as intruder:
        with pytest.raises(loom.Unauthenticated):
            intruder.list()


def test_plaintext_to_the_tls_server_is_unavailable(client, monkeypatch):
    monkeypatch.delenv("LOOM_TLS_CA")
    with loom.Client(client.server, timeout=3) as c:
        with pytest.raises(loom.Unavailable):
            c.get("anything")


def test_resubmitting_with_the_same_request_id_returns_the_same_job(client):
    request_id = loom.new_request_id()
    first = client.submit(demo_dict(steps=LONG_STEPS), request_id=request_id)
    try:
        again = client.submit(demo_dict(steps=LONG_STEPS), request_id=request_id)
        assert again.name == first.name
        assert again.request_id == request_id
        other = client.submit(demo_dict(steps=LONG_STEPS))
        client.cancel(other.name)
        assert other.name != first.name
        assert len(other.request_id) == 32  # generated
    finally:
        client.cancel(first.name)


def test_cancel_and_watch_to_cancelled(client):
    job = client.submit(demo_dict(steps=LONG_STEPS))
    cancelled = client.cancel(job.name)
    assert cancelled.name == job.name
    states = [j.state for j in client.watch(job.name)]
    assert states[-1] == loom.CANCELLED
    assert client.get(job.name).state == loom.CANCELLED


def test_list_follows_every_page(client):
    made = []
    for _ in range(3):
        job = client.submit(demo_dict(steps=LONG_STEPS))
        client.cancel(job.name)
        made.append(job.name)
    everything = [j.name for j in client.list()]
    paged = [j.name for j in client.list(page_size=1)]
    assert paged == everything  # one job per call, same jobs, same order, none repeated
    assert len(paged) >= 3 and set(made) <= set(paged)
    cancelled = [j.name for j in client.list(state="CANCELLED", page_size=2)]
    assert set(made) <= set(cancelled)
    assert all(j.state == loom.CANCELLED for j in client.list(state=loom.CANCELLED))


def test_plan_ranks_layouts_for_the_live_cluster(client, repo_root):
    response = client.plan(repo_root / "examples" / "demo.yaml", top_k=2)
    assert 1 <= len(response.plans) <= 2
    assert response.layouts_evaluated >= len(response.plans)
    assert response.devices
    with pytest.raises(loom.InvalidArgument) as e:
        client.plan({"model": {"preset": "no-such-model"}, "resources": {"cpu_devices": 1}})
    assert e.value.field == "spec.model.preset"


@pytest.fixture(scope="module")
def demo_result(demo_script):
    """(job name, loss, output) of the example script, once it has finished."""
    out, _ = demo_script.communicate(timeout=240)
    assert demo_script.returncode == 0, out
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"(jobs/\S+) SUCCEEDED loss (\S+)", last)
    assert match, out
    return match.group(1), float(match.group(2)), out


def test_example_script_follows_the_demo_to_succeeded_and_prints_the_loss(client, demo_result):
    name, loss, out = demo_result
    # Watch updates were printed on the way, ending at SUCCEEDED.
    assert re.search(rf"{re.escape(name)} RUNNING step \d+", out), out
    # The loss starts near ln(256) = 5.55 for the byte-level tiny model and ends near 2 after the
    # demo's 300 steps; 4.5 fails a model that did not learn.
    assert math.isfinite(loss) and 0.5 < loss < 4.5
    job = client.get(name)
    assert job.state == loom.SUCCEEDED
    assert job.progress.loss == pytest.approx(loss)
    assert job.progress.step == job.spec.train.steps == 300
    assert any(e.to_state == loom.SUCCEEDED for e in job.events)
    assert name in [j.name for j in client.list(state="SUCCEEDED")]
    # A finished job's watch yields its terminal snapshot and ends.
    assert [j.state for j in client.watch(name)] == [loom.SUCCEEDED]


def test_logs_of_the_demo(client, demo_result):
    name, _, _ = demo_result
    lines = list(client.logs(name))
    assert lines, "the demo's rank wrote no lines"
    assert all(line.rank == 0 and line.stream in ("stdout", "stderr") for line in lines)
    assert any("step" in line.text for line in lines)
    assert [l.text for l in client.logs(name, rank=0)] == [l.text for l in lines]
    assert list(client.logs(name, rank=1)) == []
    # follow on a finished job sends what was kept and ends.
    assert len(list(client.logs(name, follow=True))) == len(lines)


def test_report_of_the_demo(client, demo_result):
    name, _, _ = demo_result
    report = client.report(name)
    assert report.job == name
    assert report.note  # the job is not running: the report says why it is empty
    assert report.goodput.wall_seconds > 0
