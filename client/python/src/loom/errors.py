"""Loom's errors as Python exceptions: one class per gRPC status code, under LoomError.

loomd's messages name the field at fault first ("spec.train.steps: 0 must be > 0 ..."); that
name is kept apart in `LoomError.field` so that a program can act on it without parsing text.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Type

import grpc

# A leading field path such as spec.train.steps or spec.env["LD_PRELOAD"], followed by ": ".
_FIELD = re.compile(r'^([A-Za-z_][A-Za-z0-9_.]*(?:\[[^\]]*\])?(?:\.[A-Za-z0-9_.]+)*): ')
# Request fields that stand alone (without a dot) at the start of a message.
_TOP_LEVEL_FIELDS = frozenset(
    {"spec", "name", "request_id", "page_size", "page_token", "state", "rank", "top_k", "cluster"})


def _leading_field(message: str) -> Optional[str]:
    match = _FIELD.match(message)
    if match is None:
        return None
    field = match.group(1)
    return field if ("." in field or "[" in field or field in _TOP_LEVEL_FIELDS) else None


class LoomError(Exception):
    """A failed Loom call (or a client-side check that would fail the same way).

    Attributes:
      code: the grpc.StatusCode.
      message: the server's message (or the client's), which names the field and the fix.
      field: the field the message starts with (e.g. "spec.train.steps"), or None.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 field: Optional[str] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.field = field if field is not None else _leading_field(message)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Cancelled(LoomError):
    code = grpc.StatusCode.CANCELLED


class InvalidArgument(LoomError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(LoomError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(LoomError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(LoomError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(LoomError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LoomError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(LoomError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(LoomError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(LoomError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(LoomError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(LoomError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(LoomError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(LoomError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[LoomError]] = {
    cls.code: cls
    for cls in (Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, Unauthenticated)
}


def error_for(code: grpc.StatusCode, message: str) -> LoomError:
    """The LoomError subclass for `code` (LoomError itself for codes without one)."""
    return _BY_CODE.get(code, LoomError)(message, code=code)


def from_rpc_error(error: grpc.RpcError) -> LoomError:
    """Converts an error raised by a gRPC call (a grpc.Call) into a LoomError."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return error_for(code, details or code.name)
