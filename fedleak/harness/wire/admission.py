"""What one client may hold of a server at once, checked before a request's body is read.

A fedleak server reads every request body itself (:mod:`fedleak.harness.wire.handlers`
registers unary methods as request streams), so it decides **before** gRPC hands it the bytes:

- **calls per peer** (``max_calls_per_peer``): calls of one client host in flight at once,
  counted from the moment their headers arrive — stalled calls included; one more is answered
  ``RESOURCE_EXHAUSTED`` at once. **Calls per prefix** (``max_calls_per_prefix``): the same
  for every host of one network (:func:`address_prefix`: a /24 of IPv4, a /64 of IPv6 — what
  one client can own), so many addresses do not multiply the cap. Calls answered on the event
  loop without a worker (``Describe``, ``Info``) are not counted, so a client that used up its
  calls can still ask what the server is; their body (next to nothing) must arrive within
  :data:`SMALL_REQUEST_TIMEOUT`;
- **request memory** (``request_memory_bytes``): the bytes that request bodies in flight may
  make the process hold, all clients together (default: room for four of the largest
  requests), one address prefix (/24, /64: every host of one network together, as for calls
  and connections) at most half of it, so hosts whose calls stall cannot keep other networks
  waiting however many addresses they use. Of the budget, a *reserve* of one largest request
  (:attr:`ServingLimits.request_memory_reserve`, when the budget holds two) is kept for fresh
  clients: a call of a host that holds no reservation may use the whole budget, any other
  only the rest — two networks that fill their shares still leave room for a third. Before a
  body is read, its call reserves what the largest message would
  cost, ``REQUEST_COPIES`` × ``max_message_bytes``: gRPC's buffer, the bytes it hands over and
  the copy it assembles them in (measured 3.45 × a 1 GiB body at the peak), then the parsed
  message, the tensor bytes read out of it and the decoded tensor. Once the body is in, the
  reservation shrinks to its real size, and it is returned when the call's work has ended (a
  call its client cancelled keeps it until its worker has stopped). A call that finds the
  budget full waits without reading — HTTP/2 flow control keeps its bytes in the client —
  until another call ends or ``receive_timeout`` passes (``RESOURCE_EXHAUSTED``). A call is
  *stalled* from its headers until its body is in, the wait for memory included: its
  connection is evictable (below) whatever it waits for;
- **receive deadline** (``receive_timeout``): a body that has not arrived that many seconds
  after the call began is answered ``DEADLINE_EXCEEDED``, so a stalled call ends.

``max_message_bytes`` is gRPC's own limit, enforced from the length a message declares before
any of it is buffered: a larger request never reaches Python. ``max_connections_per_peer``,
``max_connections_per_prefix`` and the ceiling on all connections are enforced by
:mod:`fedleak.harness.wire.connections`, which asks :meth:`Admission.connection_calls` which
connections carry a call at work (never closed) and which only calls still waiting for their
body (stalled: closed after idle ones). All state here lives on the server's event loop;
:meth:`Admission.connection_calls` and :meth:`Admission.busy_connections` may be read from
another thread.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from fedleak.harness.wire.channel import DEFAULT_MAX_MESSAGE_BYTES
from fedleak.harness.wire.eviction import (
    Evicted,
    StalledBodies,
    StalledBody,
    read_unless_evicted,
)
from fedleak.harness.wire.heap import return_freed_heap
from fedleak.harness.wire.peers import (  # noqa: F401  (re-exported)
    address_prefix,
    peer_address,
    peer_host,
)

#: Copies of a request body a call may hold at its peak (see the module docstring).
REQUEST_COPIES = 4
DEFAULT_MAX_CALLS_PER_PEER = 16
DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
DEFAULT_RECEIVE_TIMEOUT = 60.0
#: Per-prefix caps default to this many times the per-host ones (a site behind a few NAT
#: addresses still fits; sixty addresses of one /24 do not multiply the per-host caps by 60).
PREFIX_FACTOR = 4
#: Seconds the body of a call answered on the loop (Describe: next to nothing) may take.
SMALL_REQUEST_TIMEOUT = 10.0
#: Bodies of this size or less are received without a memory reservation (a Describe
#: request, a token check): their cost is the call's own.
SMALL_REQUEST_BYTES = 64 << 10
#: After a request at least this large, freed heap pages go back to the system
#: (:func:`~fedleak.harness.wire.heap.return_freed_heap`).
TRIM_AFTER_BYTES = 8 << 20


class Refused(Exception):
    """A call the server answers with ``code`` before (or instead of) running its handler."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass(frozen=True)
class ServingLimits:
    """Caps on what clients may hold of a server (see the module docstring); ``flags`` name
    the options that set them, for refusal messages."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    request_memory_bytes: int | None = None
    max_calls_per_peer: int = DEFAULT_MAX_CALLS_PER_PEER
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT
    #: caps per address prefix (/24, /64); None: PREFIX_FACTOR times the per-host cap
    max_calls_per_prefix: int | None = None
    max_connections_per_prefix: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_calls_per_peer", "max_connections_per_peer"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name, host in (("max_calls_per_prefix", "max_calls_per_peer"),
                           ("max_connections_per_prefix", "max_connections_per_peer")):
            value = getattr(self, name)
            if value is not None and value < getattr(self, host):
                raise ValueError(f"--{_flag(name)} ({value}) must be at least --{_flag(host)} "
                                 f"({getattr(self, host)}): a network holds its hosts")
        if not (self.receive_timeout > 0 and math.isfinite(self.receive_timeout)):
            raise ValueError(f"--receive-timeout must be a positive number of seconds, got "
                             f"{self.receive_timeout}")
        least = self.largest_request_cost
        if self.request_memory_bytes is not None and self.request_memory_bytes < least:
            raise ValueError(
                f"--request-memory-mb {self.request_memory_bytes >> 20} cannot hold one "
                f"request of the largest size accepted ({self.max_message_bytes >> 20} MiB "
                f"costs up to {least >> 20} MiB while it is received and decoded): raise it "
                f"to at least {-(-least >> 20)} or lower --max-message-mb")

    @property
    def calls_per_prefix(self) -> int:
        """Calls in flight of one address prefix (as given, or PREFIX_FACTOR × per host)."""
        return self.max_calls_per_prefix or PREFIX_FACTOR * self.max_calls_per_peer

    @property
    def connections_per_prefix(self) -> int:
        """Connections of one address prefix (as given, or PREFIX_FACTOR × per host)."""
        return self.max_connections_per_prefix or \
            PREFIX_FACTOR * self.max_connections_per_peer

    @property
    def largest_request_cost(self) -> int:
        """Bytes one request of the largest accepted size may make the process hold."""
        return REQUEST_COPIES * self.max_message_bytes

    @property
    def request_memory(self) -> int:
        """The request-memory budget: as given, or room for four of the largest requests."""
        if self.request_memory_bytes is not None:
            return self.request_memory_bytes
        return 4 * self.largest_request_cost

    @property
    def request_memory_per_prefix(self) -> int:
        """What the bodies of one address prefix may reserve: half the budget (at least one of
        the largest requests), so hosts whose calls stall cannot keep other networks waiting."""
        return max(self.request_memory // 2, self.largest_request_cost)

    @property
    def request_memory_reserve(self) -> int:
        """The part of the budget only a fresh client (a host holding no reservation) may
        take: one of the largest requests, when the budget holds two (else nothing)."""
        least = self.largest_request_cost
        return least if self.request_memory >= 2 * least else 0


def _flag(name: str) -> str:
    return name.replace("_bytes", "-mb").replace("_", "-")


def _raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when this task was cancelled while ``wait_for`` returned.

    Python 3.11's ``wait_for`` swallows a cancellation that arrives as its future completes
    (a released reservation waking a waiter just as its call is cancelled): the call would then
    go on to wait for a body that never comes, holding its memory until the receive deadline.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Admission:
    """The caps of :class:`ServingLimits` for one server (state on its event loop)."""

    def __init__(self, limits: ServingLimits) -> None:
        self.limits = limits
        self._calls: Counter[str] = Counter()
        self._prefix_calls: Counter[str] = Counter()
        self._reserved = 0
        self._reserved_by: Counter[str] = Counter()  # per address prefix
        self._reserved_host: Counter[str] = Counter()  # per host (a fresh host holds none)
        self._waiters: list[asyncio.Future[None]] = []
        self._stalled = StalledBodies()  # reservations whose bodies have not arrived
        self._connections: Counter[tuple[str, int]] = Counter()
        self._receiving: Counter[tuple[str, int]] = Counter()  # calls awaiting their body
        self._lock = threading.Lock()

    # -- calls per peer -------------------------------------------------------------------

    @asynccontextmanager
    async def call(self, context: grpc.aio.ServicerContext, *, counted: bool = True) \
            -> AsyncIterator[None]:
        """Hold one of the peer's call slots (``counted``) for the body of the ``with``; the
        call's connection counts as busy meanwhile. Raises :class:`Refused` when the peer has
        none left."""
        peer = context.peer()
        host, address = peer_host(peer), peer_address(peer)
        prefix = address_prefix(host)
        if counted and self._calls[host] >= self.limits.max_calls_per_peer:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this client ({host}) already has {self._calls[host]} calls in "
                          f"flight, the server's cap per client (--max-calls-per-peer "
                          f"{self.limits.max_calls_per_peer}); wait for one to end")
        if counted and self._prefix_calls[prefix] >= self.limits.calls_per_prefix:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this client's network ({prefix}) already has "
                          f"{self._prefix_calls[prefix]} calls in flight, the server's cap per "
                          f"address prefix (--max-calls-per-prefix "
                          f"{self.limits.calls_per_prefix}); wait for one to end")
        if counted:
            self._calls[host] += 1
            self._prefix_calls[prefix] += 1
        if address is not None:
            with self._lock:
                self._connections[address] += 1
        try:
            yield
        finally:
            if counted:
                self._calls[host] -= 1
                if not self._calls[host]:
                    del self._calls[host]
                self._prefix_calls[prefix] -= 1
                if not self._prefix_calls[prefix]:
                    del self._prefix_calls[prefix]
            if address is not None:
                with self._lock:
                    self._connections[address] -= 1
                    if not self._connections[address]:
                        del self._connections[address]

    def calls_of(self, host: str) -> int:
        return self._calls[host]

    def busy_connections(self) -> set[tuple[str, int]]:
        """(host, port) of every connection with a call in flight (any thread)."""
        with self._lock:
            return set(self._connections)

    def connection_calls(self) -> dict[tuple[str, int], bool]:
        """(host, port) of every connection with a call in flight → whether one of its calls
        is at work (False: each only waits for its body — stalled by its client; any
        thread)."""
        with self._lock:
            return {address: calls > self._receiving[address]
                    for address, calls in self._connections.items()}

    @asynccontextmanager
    async def _awaiting_body(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """The call waits for its client to send its body (its connection looks stalled)."""
        address = peer_address(context.peer())
        if address is not None:
            with self._lock:
                self._receiving[address] += 1
        try:
            yield
        finally:
            if address is not None:
                with self._lock:
                    self._receiving[address] -= 1
                    if not self._receiving[address]:
                        del self._receiving[address]

    # -- request memory and the receive deadline -----------------------------------------

    @property
    def reserved(self) -> int:
        """Bytes reserved by request bodies in flight."""
        return self._reserved

    @asynccontextmanager
    async def request(self, context: grpc.aio.ServicerContext) -> AsyncIterator[list[bytes]]:
        """The call's one request body, received within the budget and the deadline, and
        reserved until the ``with`` ends; given as a one-item list, so whoever parses it can
        take it out and let the bytes go. Raises :class:`Refused`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.receive_timeout
        host = peer_host(context.peer())
        reservation = 0  # nothing held until _reserve returns
        try:
            async with self._awaiting_body(context):  # stalled: waiting for memory, then bytes
                await self._reserve(host, self.limits.largest_request_cost, deadline)
                reservation = self.limits.largest_request_cost
                stall = self._stalled.add(host)
                try:
                    body = [await self._receive(context, deadline, stall=stall)]
                finally:
                    self._stalled.discard(stall)
            size = len(body[0])
            kept = REQUEST_COPIES * size if size > SMALL_REQUEST_BYTES else 0
            self._release(host, reservation - kept)
            reservation = kept
            yield body
        finally:
            self._release(host, reservation)
            if reservation >= REQUEST_COPIES * TRIM_AFTER_BYTES:  # gRPC's receive buffers
                loop.run_in_executor(None, return_freed_heap)

    async def small_request(self, context: grpc.aio.ServicerContext, type_name: str) -> bytes:
        """The body of a call answered on the loop (``Describe``): within
        :data:`SMALL_REQUEST_TIMEOUT` (or the receive deadline when shorter), and at most
        :data:`SMALL_REQUEST_BYTES` (such requests carry next to nothing)."""
        seconds = min(self.limits.receive_timeout, SMALL_REQUEST_TIMEOUT)
        deadline = asyncio.get_running_loop().time() + seconds
        async with self._awaiting_body(context):
            raw = await self._receive(context, deadline, seconds)
        if len(raw) > SMALL_REQUEST_BYTES:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a {type_name} of {len(raw)} bytes: this request carries at most "
                          f"{SMALL_REQUEST_BYTES} bytes (see protos/)")
        return raw

    async def _receive(self, context: grpc.aio.ServicerContext, deadline: float,
                       seconds: float | None = None, stall: StalledBody | None = None) -> bytes:
        left = deadline - asyncio.get_running_loop().time()
        read = context.read() if stall is None else read_unless_evicted(context.read(), stall)
        try:
            raw = await asyncio.wait_for(read, max(left, 0.0))
            _raise_if_cancelled()
        except Evicted as evicted:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(evicted)) from None
        except TimeoutError:
            allowed = self.limits.receive_timeout if seconds is None else seconds
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"the request did not arrive within {allowed:g} s of the call's "
                          "start (the server's --receive-timeout, at most "
                          f"{SMALL_REQUEST_TIMEOUT:g} s for a small request): send it without "
                          "pausing") from None
        if raw is grpc.aio.EOF or raw is None:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          "the call ended without a request message: send exactly one")
        return raw

    def _fits(self, host: str, size: int) -> bool:
        limits = self.limits
        room = limits.request_memory - (limits.request_memory_reserve
                                        if self._reserved_host[host] else 0)
        return (self._reserved + size <= room
                and self._reserved_by[address_prefix(host)] + size
                <= limits.request_memory_per_prefix)

    async def _reserve(self, host: str, size: int, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not self._fits(host, size):
            wake = deadline
            if not self._reserved_host[host]:  # a fresh host may evict the oldest stalled body
                prefix = address_prefix(host)  # its network's first when its share is full
                full = self._reserved_by[prefix] + size > self.limits.request_memory_per_prefix
                eligible = self._stalled.evict_for(prefix if full else None)
                wake = deadline if eligible is None else min(deadline, eligible)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, max(wake - loop.time(), 0.0))
                _raise_if_cancelled()
            except TimeoutError:
                if loop.time() < deadline:
                    continue  # time to look for an evictable reservation again
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server's memory for requests in flight "
                    f"({self.limits.request_memory >> 20} MiB, at most "
                    f"{self.limits.request_memory_per_prefix >> 20} MiB for one network "
                    f"({address_prefix(host)}); "
                    f"--request-memory-mb) stayed full for {self.limits.receive_timeout:g} s; "
                    "retry when fewer large requests are running") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._reserved += size
        self._reserved_by[address_prefix(host)] += size
        self._reserved_host[host] += size

    def _release(self, host: str, size: int) -> None:
        if size <= 0:
            return
        self._reserved -= size
        prefix = address_prefix(host)
        for counter, key in ((self._reserved_by, prefix), (self._reserved_host, host)):
            counter[key] -= size
            if not counter[key]:
                del counter[key]
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each checks again whether its reservation fits
            if not waiter.done():
                waiter.set_result(None)
