"""loom.Client: Loom's JobService from Python (submit, get, list, watch, logs, cancel, plan,
report), with loomctl's connection settings (loom/connection.py) and errors as LoomError."""

from __future__ import annotations

import secrets
from typing import Iterator, List, Optional, Union

import grpc

from loom.connection import connect
from loom.errors import InvalidArgument, Unavailable, from_rpc_error
from loom.spec import SpecLike, load_spec
from loom.v1 import job_pb2, job_pb2_grpc

# The states after which a job never changes again.
TERMINAL_STATES = frozenset({job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED})
MAX_REQUEST_ID_CHARS = 128


def job_name(name: str) -> str:
    """"abc" or "jobs/abc" as the resource name "jobs/abc"; InvalidArgument for an empty id,
    another collection ("nodes/x"), or an id with '/', whitespace or control characters."""
    job_id = name[len("jobs/"):] if name.startswith("jobs/") else name
    if not job_id or any(c == "/" or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in job_id):
        raise InvalidArgument(f"name: '{name}' is not a job name; give it as 'abc' or 'jobs/abc'",
                              field="name")
    return "jobs/" + job_id


def new_request_id() -> str:
    """A fresh random idempotency key: 32 hexadecimal digits, as loomctl makes them."""
    return secrets.token_hex(16)


def _state_value(state: Union[int, str]) -> int:
    if isinstance(state, str):
        try:
            return job_pb2.JobState.Value(state.upper())
        except ValueError:
            names = ", ".join(n for n in job_pb2.JobState.keys() if n != "JOB_STATE_UNSPECIFIED")
            raise InvalidArgument(f"state: unknown job state '{state}'; one of {names}",
                                  field="state") from None
    return int(state)


class Client:
    """A connection to one loomd.

    Settings not given are read from the environment as loomctl reads them: $LOOM_SERVER (else
    127.0.0.1:7070), $LOOM_TLS_CA, $LOOM_TOKEN_FILE (else $LOOM_TOKEN). Loopback servers without
    TLS settings are reached in plaintext; others over TLS (loom/connection.py has the rules).
    Unary calls have a deadline of `timeout` seconds; streams have none.

    Every method raises a LoomError subclass (NotFound, InvalidArgument, Unavailable, ...)
    carrying the gRPC `code`, the server's `message` and the `field` it names. The client is
    safe to share between threads; close() (or a `with` block) releases the channel.
    """

    def __init__(self, server: Optional[str] = None, *, ca: Optional[str] = None,
                 token: Optional[str] = None, token_file: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None, insecure: bool = False,
                 timeout: float = 10.0) -> None:
        if not timeout > 0:
            raise InvalidArgument(f"timeout: {timeout} must be > 0 seconds", field="timeout")
        self._connection = connect(server, ca=ca, cert=cert, key=key, token=token,
                                   token_file=token_file, insecure=insecure)
        self._timeout = timeout
        self._metadata = self._connection.metadata()
        self._jobs = job_pb2_grpc.JobServiceStub(self._connection.channel)

    @property
    def server(self) -> str:
        """The HOST:PORT this client talks to."""
        return self._connection.server

    def close(self) -> None:
        """Closes the channel; streams still open end with Cancelled."""
        self._connection.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unary(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, method, request) -> Iterator:
        call = method(request, metadata=self._metadata)
        try:
            yield from call
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()  # an abandoned iterator must not keep the stream open

    def submit(self, spec: SpecLike, *, request_id: Optional[str] = None) -> job_pb2.Job:
        """Creates a job from `spec` (a dict, a YAML file path or a JobSpec) and returns it,
        usually QUEUED.

        `request_id` is the idempotency key (a fresh random one when None): submitting again with
        the same id returns the job created the first time instead of a second job. The id the
        job was created with is in the returned Job's `request_id`.
        """
        request_id = new_request_id() if request_id is None else request_id
        if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidArgument(
                f"request_id: must be 1 to {MAX_REQUEST_ID_CHARS} characters, got "
                f"{len(request_id)}; pass None for a fresh one", field="request_id")
        request = job_pb2.CreateJobRequest(spec=load_spec(spec), request_id=request_id)
        return self._unary(self._jobs.CreateJob, request)

    def get(self, name: str) -> job_pb2.Job:
        """The job `name` ("abc" or "jobs/abc") with its event log. NotFound if there is none
        (or it belongs to another tenant)."""
        return self._unary(self._jobs.GetJob, job_pb2.GetJobRequest(name=job_name(name)))

    def list(self, state: Union[int, str, None] = None, *,
             page_size: Optional[int] = None) -> List[job_pb2.Job]:
        """Every job the caller may see (only those in `state`, a JobState value or name such
        as "RUNNING", when given), oldest first, following every page. `page_size` (1..1000)
        is how many jobs each call fetches; the server's default when None."""
        request = job_pb2.ListJobsRequest()
        if state is not None:
            request.state = _state_value(state)
        if page_size is not None:
            request.page_size = page_size
        jobs: List[job_pb2.Job] = []
        while True:
            response = self._unary(self._jobs.ListJobs, request)
            jobs.extend(response.jobs)
            if not response.next_page_token:
                return jobs
            request.page_token = response.next_page_token

    def watch(self, name: str) -> Iterator[job_pb2.Job]:
        """Yields a snapshot of job `name` on every state change and progress update; the
        iterator ends after the first snapshot in a terminal state (SUCCEEDED, FAILED,
        CANCELLED). A stream that breaks before then raises the error (e.g. Unavailable while
        loomd restarts); calling watch again resumes with the job's current snapshot."""
        return self._watch(job_pb2.WatchJobRequest(name=job_name(name)))

    def _watch(self, request: job_pb2.WatchJobRequest) -> Iterator[job_pb2.Job]:
        for update in self._stream(self._jobs.WatchJob, request):
            yield update.job
            if update.job.state in TERMINAL_STATES:
                return
        raise Unavailable(f"the watch of {request.name} ended before the job did; watch again")

    def wait(self, name: str) -> job_pb2.Job:
        """Follows job `name` to its end and returns its terminal snapshot (see watch)."""
        last: Optional[job_pb2.Job] = None
        for last in self.watch(name):
            pass
        if last is None:  # watch ends only after a terminal snapshot; this is a safety net
            raise Unavailable(f"no snapshot of {name} came back; wait again")
        return last

    def logs(self, name: str, *, follow: bool = False,
             rank: Optional[int] = None) -> Iterator[job_pb2.LogLine]:
        """Yields the output lines of job `name`'s ranks (LogLine: rank, stream "stdout" or
        "stderr", text, generation, node), oldest first: those kept so far, then, with
        `follow`, new ones until the job ends. Only rank `rank`'s lines when given."""
        request = job_pb2.StreamJobLogsRequest(name=job_name(name), follow=follow)
        if rank is not None:
            request.rank = rank
        return self._stream(self._jobs.StreamJobLogs, request)

    def cancel(self, name: str) -> job_pb2.Job:
        """Cancels job `name` and returns it; cancelling a job that already ended changes
        nothing (the server says which, e.g. FailedPrecondition)."""
        return self._unary(self._jobs.CancelJob, job_pb2.CancelJobRequest(name=job_name(name)))

    def plan(self, spec: SpecLike, *, cluster: Optional[job_pb2.ClusterDescription] = None,
             top_k: Optional[int] = None) -> job_pb2.PlanJobResponse:
        """Ranks the parallel layouts of `spec` (a dry run: nothing is created) on the live
        cluster, or on `cluster` when given. `top_k` plans are returned (server default 5).
        FailedPrecondition when no layout fits the devices."""
        request = job_pb2.PlanJobRequest(spec=load_spec(spec))
        if cluster is not None:
            request.cluster.CopyFrom(cluster)
        if top_k is not None:
            request.top_k = top_k
        return self._unary(self._jobs.PlanJob, request)

    def report(self, name: str) -> job_pb2.JobReport:
        """The doctor's view of job `name` (GetJobReport): raised and pending findings, per
        stage and per rank figures, goodput; a job that is not running gets a report whose
        `note` says why it is empty."""
        return self._unary(self._jobs.GetJobReport,
                           job_pb2.GetJobReportRequest(name=job_name(name)))


__all__ = ["Client", "TERMINAL_STATES", "job_name", "new_request_id"]
