"""A service's handlers for gRPC's asyncio server: requests received on the loop, work on threads.

:func:`add_service` registers every method of a ``.proto`` service from its descriptor:

- a handler written as a coroutine (or async generator) runs on the event loop as it is —
  cheap answers such as ``Describe``, or streams that must be read without holding a thread;
- a plain handler (or generator) runs on a worker thread **after** its request has arrived,
  with a :class:`ThreadContext`: ``abort`` raises, ``is_active`` turns false and the
  ``add_callback`` callbacks run as soon as the call ends — answered, cancelled by the client or
  past its deadline — so long work can stop (gRPC's own thread context for the asyncio server
  reports neither);
- a request that is not a valid message of the method's type (raw garbage bytes) is answered
  ``INVALID_ARGUMENT`` naming the message type, never gRPC's ``INTERNAL`` "Exception
  deserializing request": the deserializer returns a :class:`Garbage` marker instead of
  raising, and the handler wrapper (or an async stream handler, through :func:`check_message`)
  refuses it.
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

log = logging.getLogger(__name__)


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


def _deserializer(cls: type[Message]) -> Callable[[bytes], Message | Garbage]:
    name = cls.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Garbage:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as err:
            return Garbage(name, str(err) or type(err).__name__)

    return parse


async def check_message(request: Any, context: grpc.aio.ServicerContext) -> None:
    """Abort the call with ``INVALID_ARGUMENT`` when ``request`` is :class:`Garbage`."""
    if isinstance(request, Garbage):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


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


def _unary_in_thread(function: Callable[..., Any], pool: futures.Executor) -> Callable[..., Any]:
    @functools.wraps(function)
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check_message(request, context)
        threaded = ThreadContext(context)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, function, request, threaded)
        except Aborted as err:
            await context.abort(err.code, err.details)
        finally:
            threaded.end()

    return handler


def _stream_in_thread(function: Callable[..., Iterator[Any]],
                      pool: futures.Executor) -> Callable[..., AsyncIterator[Any]]:
    done = object()

    @functools.wraps(function)
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await check_message(request, context)
        threaded = ThreadContext(context)
        loop = asyncio.get_running_loop()
        try:
            responses = await loop.run_in_executor(pool, function, request, threaded)
            while (response := await loop.run_in_executor(pool, next, responses, done)) \
                    is not done:
                yield response
        except Aborted as err:
            await context.abort(err.code, err.details)
        finally:
            threaded.end()

    return handler


def _passthrough(function: Callable[..., Any], streaming_request: bool) -> Callable[..., Any]:
    """An async handler as it is; a unary request is checked for garbage first."""
    if streaming_request:
        return function
    if inspect.isasyncgenfunction(function):
        @functools.wraps(function)
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check_message(request, context)
            async for response in function(request, context):
                yield response

        return stream

    @functools.wraps(function)
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check_message(request, context)
        return await function(request, context)

    return unary


def _method_handler(method: MethodDescriptor, function: Callable[..., Any],
                    pool: futures.Executor) -> grpc.RpcMethodHandler:
    request = message_factory.GetMessageClass(method.input_type)
    response = message_factory.GetMessageClass(method.output_type)
    is_async = inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
    streams_in, streams_out = method.client_streaming, method.server_streaming
    if is_async:
        behaviour = _passthrough(function, streams_in)
    elif streams_in:
        raise TypeError(f"{method.full_name} streams its requests: write its handler as a "
                        "coroutine, so a stalled stream holds no thread")
    elif streams_out:
        behaviour = _stream_in_thread(function, pool)
    else:
        behaviour = _unary_in_thread(function, pool)
    kind = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[(streams_in, streams_out)]
    return kind(behaviour, request_deserializer=_deserializer(request),
                response_serializer=response.SerializeToString)


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor,
                pool: futures.Executor) -> None:
    """Register every method of ``service`` with ``servicer``'s handler of the same name."""
    handlers = {method.name: _method_handler(method, getattr(servicer, method.name), pool)
                for method in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
