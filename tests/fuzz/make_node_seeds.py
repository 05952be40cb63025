#!/usr/bin/env python3
"""Writes the seed corpus of node_messages_fuzz (corpus/node_messages/) from protobuf text.

Each seed is a script in the target's input format (node_messages_fuzz.cc): payloads from the
front, each a message in protobuf wire bytes as FuzzedDataProvider's ConsumeRandomLengthString
reads it (a backslash doubled, and a backslash followed by another byte ends it), and the
operation bytes from the back, the first operation last. Wire bytes come from
`protoc --encode`, so the seeds are real messages of the current protos. Rerun after a change
to proto/loom/v1/node.proto: python3 tests/fuzz/make_node_seeds.py
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus", "node_messages")

REGISTER, HELLO, MESSAGE, TICK = 0, 1, 2, 4


def encode(message_type, text):
    return subprocess.run(
        ["protoc", "-I", os.path.join(ROOT, "proto"), "--encode=loom.v1." + message_type,
         "loom/v1/node.proto"], input=text.encode(), capture_output=True, check=True).stdout


def script(ops):
    """ops: (kind, text or milliseconds) in order."""
    front, back = b"", b""
    for kind, arg in ops:
        # The back is read from its end: this operation's byte, then (a tick) its duration,
        # ConsumeIntegralInRange<int64_t>(0, 60000): two bytes, the first read the high one.
        segment = bytes([kind])
        if kind == TICK:
            payload = b""
            ms = int(arg)
            segment = bytes([ms & 0xFF, (ms >> 8) & 0xFF]) + segment
        else:
            message_type = {REGISTER: "RegisterNodeRequest", HELLO: "SessionHello",
                            MESSAGE: "WorkerMessage"}[kind]
            payload = encode(message_type, arg)
        front += payload.replace(b"\\", b"\\\\") + b"\\\n"
        back = segment + back
    return front + back


def rank(r, phase, extra=""):
    return f'rank_status {{ job: "$" generation: 1 rank: {r} phase: {phase} {extra} }}'


def batch(*statuses):
    """One rank_statuses message; each status as (rank, phase, extra)."""
    inner = " ".join(f'statuses {{ job: "$" generation: 1 rank: {r} phase: {phase} {extra} }}'
                     for r, phase, extra in statuses)
    return f"rank_statuses {{ {inner} }}"


def step(r, s):
    return (f'step {{ job: "$" generation: 1 rank: {r} step: {s} total_steps: 10 loss: 3.5 '
            f'tokens_per_second: 1000 lr: 0.0006 step_seconds: 0.5 }}')


SEEDS = {
    "run-and-succeed": [(MESSAGE, rank(0, "RANK_PHASE_RUNNING")),
                        (MESSAGE, rank(1, "RANK_PHASE_RUNNING")),
                        (MESSAGE, step(0, 5)), (MESSAGE, step(1, 5)),
                        (MESSAGE, rank(0, "RANK_PHASE_EXITED", "exit_class: EXIT_CLASS_SUCCESS")),
                        (MESSAGE, rank(1, "RANK_PHASE_EXITED", "exit_class: EXIT_CLASS_SUCCESS"))],
    "crash-and-restart": [(MESSAGE, rank(0, "RANK_PHASE_RUNNING")),
                          (MESSAGE, rank(1, "RANK_PHASE_RUNNING")),
                          (MESSAGE, rank(1, "RANK_PHASE_EXITED",
                                         "exit_class: EXIT_CLASS_RETRYABLE signal: 9")),
                          (TICK, 1500),
                          (HELLO, 'node_id: "n1" running { job: "$" generation: 2 ranks: 0 }')],
    "logs-and-heartbeat": [(MESSAGE, 'logs { job: "$" generation: 1 rank: 0 stream: "stderr" '
                                     'lines: "hello" lines: "world" }'),
                           (MESSAGE, "heartbeat { time { seconds: 1700000001 } }"),
                           (TICK, 11000)],
    "batched-run-and-succeed": [
        (MESSAGE, batch((0, "RANK_PHASE_RUNNING", ""), (1, "RANK_PHASE_RUNNING", ""))),
        (MESSAGE, step(0, 5)),
        (MESSAGE, batch((0, "RANK_PHASE_EXITED", "exit_class: EXIT_CLASS_SUCCESS"),
                        (1, "RANK_PHASE_EXITED", "exit_class: EXIT_CLASS_SUCCESS")))],
    "second-node": [(REGISTER, 'node_id: "n2" hostname: "n2.local" devices { kind: DEVICE_KIND_GPU '
                               'index: 0 model: "H100" memory_bytes: 85899345920 }'),
                    (HELLO, 'node_id: "n2"'),
                    (MESSAGE, rank(0, "RANK_PHASE_RUNNING"))],
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, ops in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(script(ops))
    print(f"wrote {len(SEEDS)} seeds to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
