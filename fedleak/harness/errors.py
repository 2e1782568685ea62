"""Errors a victim raises for bad requests, each mapped to the gRPC status a client sees.

The victim's logic raises these; the gRPC layer turns them into ``context.abort(code, msg)``
and keeps serving. Messages say what the caller should change.
"""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request the victim refuses; ``code`` is the gRPC status to answer with."""

    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT


class InvalidArgument(RequestError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(RequestError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(RequestError):
    code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(RequestError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(RequestError):
    code = grpc.StatusCode.UNAVAILABLE
