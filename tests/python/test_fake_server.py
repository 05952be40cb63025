"""The client's protocol handling against an in-process fake JobService: what it sends (token,
page tokens, rank presence) and how it treats what comes back (deadlines, streams that end)."""

import threading
import time
from concurrent import futures

import grpc
import pytest

import loom
from loom.v1 import job_pb2, job_pb2_grpc


class FakeJobService(job_pb2_grpc.JobServiceServicer):
    def __init__(self):
        self.requests = []
        self.metadata = []
        self.watch_states = []
        self.cancelled = threading.Event()

    def _record(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))

    def ListJobs(self, request, context):
        self._record(request, context)
        page = int(request.page_token or "0")
        token = str(page + 1) if page < 2 else ""
        return job_pb2.ListJobsResponse(jobs=[job_pb2.Job(name=f"jobs/j{page}")],
                                        next_page_token=token)

    def GetJob(self, request, context):
        self._record(request, context)
        time.sleep(1.0)
        return job_pb2.Job(name=request.name)

    def WatchJob(self, request, context):
        self._record(request, context)
        context.add_callback(self.cancelled.set)
        for state in self.watch_states:
            yield job_pb2.JobUpdate(job=job_pb2.Job(name=request.name, state=state))
        # Past the list: a stream that stays open until the client goes away.
        while context.is_active() and self.watch_states[-1:] == [loom.SUCCEEDED]:
            time.sleep(0.01)

    def StreamJobLogs(self, request, context):
        self._record(request, context)
        yield job_pb2.LogLine(rank=0, text="a")


@pytest.fixture
def fake(monkeypatch):
    # A plaintext fake: the live cluster's TLS and token settings must not apply.
    for var in ("LOOM_TLS_CA", "LOOM_TOKEN_FILE", "LOOM_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    service = FakeJobService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    job_pb2_grpc.add_JobServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with loom.Client(f"127.0.0.1:{port}", token="tok", timeout=0.3) as client:
        yield service, client
    server.stop(None)


def test_token_is_sent_as_bearer_metadata(fake):
    service, client = fake
    client.list()
    assert service.metadata[0]["authorization"] == "Bearer tok"


def test_list_follows_page_tokens_and_passes_page_size(fake):
    service, client = fake
    names = [j.name for j in client.list(state="QUEUED", page_size=7)]
    assert names == ["jobs/j0", "jobs/j1", "jobs/j2"]
    assert [r.page_token for r in service.requests] == ["", "1", "2"]
    assert all(r.page_size == 7 and r.state == loom.JobState.Value("QUEUED")
               for r in service.requests)


def test_unary_calls_have_the_deadline(fake):
    _, client = fake
    with pytest.raises(loom.DeadlineExceeded):
        client.get("x")


def test_watch_ends_at_the_terminal_state_and_closes_the_stream(fake):
    service, client = fake
    service.watch_states = [loom.JobState.Value("RUNNING"), loom.SUCCEEDED]
    assert [j.state for j in client.watch("x")] == service.watch_states
    assert service.requests[0].name == "jobs/x"
    assert service.cancelled.wait(5), "the watch stream was left open"


def test_watch_that_ends_before_the_job_raises_unavailable(fake):
    service, client = fake
    service.watch_states = [loom.JobState.Value("RUNNING")]
    seen = []
    with pytest.raises(loom.Unavailable, match="ended before the job did"):
        for job in client.watch("x"):
            seen.append(job.state)
    assert seen == [loom.JobState.Value("RUNNING")]


def test_logs_rank_is_sent_only_when_given(fake):
    service, client = fake
    assert [l.text for l in client.logs("x")] == ["a"]
    assert [l.text for l in client.logs("x", rank=0, follow=True)] == ["a"]
    assert not service.requests[0].HasField("rank")
    assert service.requests[1].HasField("rank") and service.requests[1].rank == 0
    assert service.requests[1].follow


def test_bad_names_fail_before_any_call(fake):
    service, client = fake
    for call in (client.get, client.watch, client.logs, client.cancel, client.report):
        with pytest.raises(loom.InvalidArgument):
            call("nodes/x")
    assert service.requests == []
