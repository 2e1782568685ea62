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

__all__ = ["MAX_LIST_ENTRIES", "Cancelled", "FailedPrecondition", "InvalidArgument", "NotFound",
           "RequestError", "ResourceExhausted", "Unauthenticated", "Unavailable",
           "answer_errors", "quoted", "refuse_long_lists"]

#: Entries any list (repeated) field of a request may hold unless its own cap is smaller.
MAX_LIST_ENTRIES = 1 << 16

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


def refuse_long_lists(message: Any, caps: dict[str, int] | None = None,
                      what: str = "request") -> None:
    """Refuse a list field of ``message`` longer than its cap, by its length alone.

    Every repeated field of the message (read from its descriptor, so a field added to the
    proto is covered) may hold at most ``caps[name]`` entries, or :data:`MAX_LIST_ENTRIES`;
    ``len`` of a protobuf list is O(1), so an 8-million-entry list is refused before any
    Python loop walks it. Raises :class:`InvalidArgument` naming the field and its cap.
    """
    caps = caps or {}
    for field in message.DESCRIPTOR.fields:
        if not getattr(field, "is_repeated", field.label == 3):  # 3: LABEL_REPEATED
            continue
        cap = min(caps.get(field.name, MAX_LIST_ENTRIES), MAX_LIST_ENTRIES)
        length = len(getattr(message, field.name))
        if length > cap:
            raise InvalidArgument(f"{what}: {field.name} holds {length} entries, at most {cap} "
                                  "are meaningful here; send only the entries that apply")


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
