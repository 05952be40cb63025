"""The Loom Python client.

    import loom

    client = loom.Client()                      # $LOOM_SERVER, $LOOM_TLS_CA, $LOOM_TOKEN_FILE
    job = client.submit("examples/demo.yaml")   # or a dict; idempotent by request_id
    for job in client.watch(job.name):          # ends at SUCCEEDED, FAILED or CANCELLED
        print(loom.JobState.Name(job.state), job.progress.step, job.progress.loss)

Messages are the generated protobuf classes of loom.v1 (loom.Job, loom.JobSpec, ...); errors are
LoomError subclasses named after their gRPC codes (loom.NotFound, loom.InvalidArgument, ...).
"""

from loom.client import TERMINAL_STATES, Client, job_name, new_request_id
from loom.errors import (Aborted, AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition,
                         Internal, InvalidArgument, LoomError, NotFound, OutOfRange,
                         PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                         Unimplemented)
from loom.spec import load_spec, spec_from_dict, spec_from_yaml
from loom.v1.job_pb2 import (ClusterDescription, Job, JobReport, JobSpec, JobState, LogLine,
                             PlanJobResponse)

SUCCEEDED = JobState.Value("SUCCEEDED")
FAILED = JobState.Value("FAILED")
CANCELLED = JobState.Value("CANCELLED")

__all__ = [
    "Client", "TERMINAL_STATES", "job_name", "new_request_id", "load_spec", "spec_from_dict",
    "spec_from_yaml", "ClusterDescription", "Job", "JobReport", "JobSpec", "JobState", "LogLine",
    "PlanJobResponse", "SUCCEEDED", "FAILED", "CANCELLED", "LoomError", "Aborted", "AlreadyExists",
    "Cancelled", "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument",
    "NotFound", "OutOfRange", "PermissionDenied", "ResourceExhausted", "Unauthenticated",
    "Unavailable", "Unimplemented"
]
