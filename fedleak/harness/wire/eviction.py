"""Reservations whose bodies have not arrived, and their eviction for a fresh client.

A call reserves request memory before its body is read (:mod:`fedleak.harness.wire.admission`).
Shares per host and per address prefix bound what one network may hold, but hosts of one /24
that hold the prefix's share with bodies that never come keep every other host of that network
waiting until the receive deadline. The rule here is the overload managers' (Envoy's, gRPC's):
when a *fresh* host (one holding no reservation) cannot be admitted, the **oldest** reservation
whose body has not arrived after :data:`EVICT_AFTER` seconds is evicted — its call is answered
``RESOURCE_EXHAUSTED`` naming why, its memory returned — in the fresh host's network first
when that network's share is what is full. A client that sends its body without pausing is
never stalled that long, so eviction costs only those who hold memory without using it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from fedleak.harness.wire.peers import address_prefix

#: seconds a reservation may wait for its body before a fresh client may evict it
EVICT_AFTER = 1.0
#: what an evicted call is told
EVICTED = (f"this call's request body had not arrived {EVICT_AFTER:g} s after its memory was "
           "reserved while the server's request memory was full: its reservation went to a "
           "client that held none; send the request without pausing")


class Evicted(Exception):
    """The call's reservation was evicted for a fresh client (:data:`EVICTED` says why)."""


@dataclass
class StalledBody:
    """One reservation waiting for its body: whose, since when, and its eviction signal."""

    host: str
    since: float
    evicted: asyncio.Future[None] = field(repr=False)


class StalledBodies:
    """The reservations still waiting for their bodies, oldest first (event-loop state)."""

    def __init__(self) -> None:
        self._waiting: list[StalledBody] = []

    def add(self, host: str) -> StalledBody:
        """Record a reservation of ``host`` whose body is now awaited."""
        loop = asyncio.get_running_loop()
        entry = StalledBody(host, loop.time(), loop.create_future())
        self._waiting.append(entry)
        return entry

    def discard(self, entry: StalledBody) -> None:
        """Forget ``entry`` (its body arrived, or its call ended)."""
        if entry in self._waiting:
            self._waiting.remove(entry)

    def evict_for(self, prefix: str | None) -> float | None:
        """Evict the oldest reservation stalled past :data:`EVICT_AFTER` (of ``prefix`` only,
        when given) for a fresh client.

        Returns
        -------
        float or None
            Loop time at which the oldest such reservation becomes evictable; None when one
            was evicted (its release wakes the waiters) or none waits.
        """
        now = asyncio.get_running_loop().time()
        candidates = [entry for entry in self._waiting
                      if prefix is None or address_prefix(entry.host) == prefix]
        if not candidates:
            return None
        oldest = candidates[0]
        if now - oldest.since < EVICT_AFTER:
            return oldest.since + EVICT_AFTER
        self._waiting.remove(oldest)
        if not oldest.evicted.done():
            oldest.evicted.set_result(None)
        return None  # one at a time: its release wakes the waiters


async def read_unless_evicted(read: Awaitable[Any], entry: StalledBody) -> Any:
    """Await ``read`` (the call's body) unless ``entry`` is evicted first.

    Raises
    ------
    Evicted
        When the reservation was evicted for a fresh client first.
    """
    reading: asyncio.Future[Any] = asyncio.ensure_future(read)
    either: set[asyncio.Future[Any]] = {reading, entry.evicted}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not reading.done():
            reading.cancel()
    if reading.done() and not reading.cancelled():
        return reading.result()
    raise Evicted(EVICTED)
