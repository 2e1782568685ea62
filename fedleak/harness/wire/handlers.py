"""A service's handlers for gRPC's asyncio server: bodies read by fedleak, work on threads.

:func:`add_service` registers every method of a ``.proto`` service from its descriptor.
Methods whose client sends one request are registered as *request streams* (a client cannot
tell: the wire is the same), so fedleak's code runs when a call's headers arrive, before its
body is read, and :class:`~fedleak.harness.wire.admission.Admission` decides first — the
client's calls in flight, the memory request bodies may hold, the deadline for the body:

- a plain handler (or generator) runs on a worker thread **after** its request has arrived;
  the request is parsed there too, never on the event loop, with a :class:`ThreadContext`:
  ``abort`` raises, ``is_active`` turns false and the ``add_callback`` callbacks run as soon as
  the call ends — answered, cancelled by the client or past its deadline — so long work can
  stop (gRPC's own thread context for the asyncio server reports neither);
- a handler written as a coroutine (``Describe``, the defense service's ``Info``) runs on the
  event loop; its request must be small and is not counted against the client's calls;
- a handler that streams its requests (``Defend``) reads them itself, on the loop.

Errors are answered with ``set_code``/``set_details``, never ``context.abort``: gRPC's abort
stores the exception it raises in the call's state, whose traceback holds the handler's frame
and so the request — a reference cycle that kept every refused request (up to gigabytes) alive
until the garbage collector ran. Nothing that crosses the executor carries an exception either:
a worker returns its answer or its refusal as plain values. A request that is not a valid
message of the method's type (raw garbage bytes) is answered ``INVALID_ARGUMENT`` naming the
message type, never gRPC's ``INTERNAL`` "Exception deserializing request".
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from fedleak.harness.wire.admission import Admission, Refused, ServingLimits
from fedleak.harness.wire.quoting import short_details

log = logging.getLogger(__name__)

#: A refusal as plain values: (status code, details).
Refusal = tuple[grpc.StatusCode, str]


class Garbage:
    """What the deserializer returns for bytes that are not a message of the expected type."""

    def __init__(self, type_name: str, reason: str) -> None:
        self.message = (f"the request is not a valid {type_name} message ({reason}); send a "
                        "serialized message of that type (see protos/)")


class Aborted(Exception):
    """Raised in a worker thread by :meth:`ThreadContext.abort`; answered on the loop."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _parser(cls: type[Message]) -> Callable[[bytes], Message | Garbage]:
    name = cls.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Garbage:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as err:
            return Garbage(name, str(err) or type(err).__name__)

    return parse


def check_message(request: Any) -> None:
    """Raise :class:`Refused` (``INVALID_ARGUMENT``) when ``request`` is :class:`Garbage`."""
    if isinstance(request, Garbage):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def answer(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End the call with ``code`` once its handler returns (no exception is raised or kept)."""
    context.set_code(code)
    context.set_details(short_details(details))


class ThreadContext:
    """The parts of ``grpc.ServicerContext`` fedleak's handlers use, from a worker thread."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._ended = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if not self._ended.is_set():
                self._callbacks.append(callback)
                return True
        callback()
        return True

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def peer(self) -> str:
        return self._context.peer()

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def end(self) -> None:
        """The call is over: ``is_active`` turns false, callbacks run (once)."""
        with self._lock:
            if self._ended.is_set():
                return
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one callback must not stop the others
                log.exception("call-end callback failed")


# -- on a worker thread: parse, run, and return values (never an exception) ---------------------

def _refusal_of(err: BaseException, method: str) -> Refusal:
    if isinstance(err, Aborted):
        return err.code, err.details
    log.error("internal error in %s", method, exc_info=err)
    return grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"


def _run(function: Callable[..., Any], parse: Callable[[bytes], Any], body: list[bytes],
         context: ThreadContext) -> tuple[Any, Refusal | None]:
    """Parse the body (taking it out of ``body``, so only the parsed request stays alive) and
    run ``function``; its answer or its refusal."""
    request = parse(body.pop())
    if isinstance(request, Garbage):
        return None, (grpc.StatusCode.INVALID_ARGUMENT, request.message)
    try:
        return function(request, context), None
    except Exception as err:  # noqa: BLE001 - answered; the server keeps serving
        return None, _refusal_of(err, function.__name__)


_DONE = object()


def _next(responses: Iterator[Any], method: str) -> tuple[Any, Refusal | None]:
    try:
        return next(responses, _DONE), None
    except Exception as err:  # noqa: BLE001 - answered; the server keeps serving
        return _DONE, _refusal_of(err, method)


async def _finish(work: asyncio.Future[Any], threaded: ThreadContext) -> Any:
    """``work``'s result. When the call is cancelled meanwhile (its client left, the server
    stops), the worker is told at once (``is_active`` turns false) and the caller still waits
    for it to stop, so the request it holds stays counted in the request memory until then."""
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        threaded.end()
        await asyncio.wait([work])
        raise


# -- the handlers as gRPC sees them ----------------------------------------------------------

def _unary_in_thread(function: Callable[..., Any], parse: Callable[[bytes], Any],
                     pool: futures.Executor, admission: Admission) -> Callable[..., Any]:
    @functools.wraps(function)
    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal: Refusal | None = None
        response = None
        threaded = ThreadContext(context)
        try:
            async with admission.call(context), admission.request(context) as body:
                response, refusal = await _finish(asyncio.get_running_loop().run_in_executor(
                    pool, _run, function, parse, body, threaded), threaded)
        except Refused as err:
            refusal = err.code, err.details
        finally:
            threaded.end()
        if refusal is not None:
            answer(context, *refusal)
            return None
        return response

    return handler


def _stream_in_thread(function: Callable[..., Iterator[Any]], parse: Callable[[bytes], Any],
                      pool: futures.Executor,
                      admission: Admission) -> Callable[..., AsyncIterator[Any]]:
    name = function.__name__

    @functools.wraps(function)
    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        refusal: Refusal | None = None
        threaded = ThreadContext(context)
        loop = asyncio.get_running_loop()
        try:
            async with admission.call(context), admission.request(context) as body:
                responses, refusal = await _finish(loop.run_in_executor(
                    pool, _run, function, parse, body, threaded), threaded)
                while refusal is None:
                    response, refusal = await _finish(
                        loop.run_in_executor(pool, _next, responses, name), threaded)
                    if response is _DONE:
                        break
                    yield response
        except Refused as err:
            refusal = err.code, err.details
        finally:
            threaded.end()
        if refusal is not None:
            answer(context, *refusal)

    return handler


def _unary_on_loop(function: Callable[..., Any], parse: Callable[[bytes], Any],
                   admission: Admission, type_name: str) -> Callable[..., Any]:
    """A coroutine handler of a small request, answered on the loop; not counted against the
    client's calls (it holds no worker and answers at once)."""

    @functools.wraps(function)
    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async with admission.call(context, counted=False):
                request = parse(await admission.small_request(context, type_name))
                check_message(request)
                return await function(request, context)
        except Refused as err:
            answer(context, err.code, err.details)
            return None

    return handler


def _streaming_in(function: Callable[..., Any], admission: Admission) -> Callable[..., Any]:
    """A coroutine handler that reads its request stream itself, counted against the client's
    calls; :class:`Refused` raised by it is answered."""
    if inspect.isasyncgenfunction(function):
        @functools.wraps(function)
        async def stream(requests: Any, context: grpc.aio.ServicerContext) \
                -> AsyncIterator[Any]:
            try:
                async with admission.call(context):
                    async for response in function(requests, context):
                        yield response
            except Refused as err:
                answer(context, err.code, err.details)

        return stream

    @functools.wraps(function)
    async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async with admission.call(context):
                return await function(requests, context)
        except Refused as err:
            answer(context, err.code, err.details)
            return None

    return unary


def _method_handler(method: MethodDescriptor, function: Callable[..., Any],
                    pool: futures.Executor, admission: Admission) -> grpc.RpcMethodHandler:
    request = message_factory.GetMessageClass(method.input_type)
    response = message_factory.GetMessageClass(method.output_type)
    parse = _parser(request)
    is_async = inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
    streams_in, streams_out = method.client_streaming, method.server_streaming
    serialize = response.SerializeToString
    if streams_in:
        if not is_async:
            raise TypeError(f"{method.full_name} streams its requests: write its handler as a "
                            "coroutine, so a stalled stream holds no thread")
        kind = grpc.stream_stream_rpc_method_handler if streams_out \
            else grpc.stream_unary_rpc_method_handler
        return kind(_streaming_in(function, admission), request_deserializer=parse,
                    response_serializer=serialize)
    if is_async:
        if streams_out:
            raise TypeError(f"{method.full_name}: a coroutine handler streaming its answers "
                            "is not supported; write it as a plain generator")
        behaviour = _unary_on_loop(function, parse, admission, request.DESCRIPTOR.full_name)
    elif streams_out:
        behaviour = _stream_in_thread(function, parse, pool, admission)
    else:
        behaviour = _unary_in_thread(function, parse, pool, admission)
    # the body is read by fedleak (raw bytes: no deserializer), see the module docstring
    kind = grpc.stream_stream_rpc_method_handler if streams_out \
        else grpc.stream_unary_rpc_method_handler
    return kind(behaviour, request_deserializer=None, response_serializer=serialize)


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor,
                pool: futures.Executor, admission: Admission | None = None) -> None:
    """Register every method of ``service`` with ``servicer``'s handler of the same name,
    behind ``admission`` (default: :class:`ServingLimits` defaults)."""
    admission = admission or Admission(ServingLimits())
    handlers = {method.name: _method_handler(method, getattr(servicer, method.name), pool,
                                             admission)
                for method in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
