"""Errors a service raises for bad requests, each mapped to the gRPC status a client sees.

The victim's logic (and the defense service's) raises these; :func:`answer_errors` turns them
into ``context.abort(code, message)`` in one place, and the server keeps serving. Messages say
what the caller should change.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from fedleak.harness.wire.codec import CodecError
from fedleak.harness.wire.quoting import quoted, short_details

__all__ = ["Cancelled", "FailedPrecondition", "InvalidArgument", "NotFound", "RequestError",
           "ResourceExhausted", "Unauthenticated", "Unavailable", "answer_errors", "quoted"]

log = logging.getLogger(__name__)

R = TypeVar("R")


class RequestError(Exception):
    """A request the service refuses; ``code`` is the gRPC status to answer with."""

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


class ResourceExhausted(RequestError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Cancelled(RequestError):
    """The caller went away (cancelled, timed out, or the service is stopping)."""

    code = grpc.StatusCode.CANCELLED


def answer_errors(method: Callable[..., R]) -> Callable[..., R]:
    """Decorate an RPC handler: :class:`RequestError` → its status, a bad tensor →
    ``INVALID_ARGUMENT``, anything unexpected → logged and ``INTERNAL`` (the server keeps
    serving)."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except RequestError as err:
            context.abort(err.code, short_details(str(err)))
        except CodecError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, short_details(str(err)))
        except Exception as err:  # noqa: BLE001 - the server must keep serving
            log.exception("internal error in %s", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL,
                          short_details(f"{type(err).__name__}: {err}"))
        raise AssertionError("unreachable")  # context.abort raises

    return wrapper
