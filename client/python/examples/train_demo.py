"""Submits examples/demo.yaml, follows the job to its end and prints its loss (issue 13's
ten-line script). Run from the repository root with a cluster's env sourced:
    python client/python/examples/train_demo.py [SPEC]"""
import sys

import loom

client = loom.Client()  # $LOOM_SERVER, $LOOM_TLS_CA and $LOOM_TOKEN_FILE, as loomctl reads them
job = client.submit(sys.argv[1] if len(sys.argv) > 1 else "examples/demo.yaml")
for job in client.watch(job.name):
    print(job.name, loom.JobState.Name(job.state), "step", job.progress.step, flush=True)
print(job.name, loom.JobState.Name(job.state), "loss", job.progress.loss)
sys.exit(0 if job.state == loom.SUCCEEDED else 1)
