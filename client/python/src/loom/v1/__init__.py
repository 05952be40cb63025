"""Loom's API (proto/loom/v1), generated at build time: job_pb2, node_pb2, trace_pb2, scaling_pb2,
rendezvous_pb2 and their *_pb2_grpc stubs. Not committed: setup.py writes them from proto/."""
