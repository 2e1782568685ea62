"""A fresh host evicts the oldest stalled reservation of its own network (issue 50's hold).

Two hosts of one /24 hold that network's share of request memory with bodies that never come;
a third host of the same /24, holding nothing, is admitted once the oldest stalled reservation
has waited :data:`~fedleak.harness.wire.eviction.EVICT_AFTER` seconds — its call is answered
``RESOURCE_EXHAUSTED`` naming why — instead of waiting for the receive deadline.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fedleak.harness.wire import eviction
from fedleak.harness.wire.admission import Admission, Refused, ServingLimits


class Context:
    """Who calls, and a body that arrives when ``arrived`` is set."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.arrived = asyncio.Event()

    def peer(self) -> str:
        return self._peer

    async def read(self) -> bytes:
        await self.arrived.wait()
        return b"x"


async def _held(admission: Admission, context: Context) -> None:
    async with admission.call(context, counted=False), admission.request(context):
        await asyncio.Event().wait()


def test_a_fresh_host_of_the_holders_network_evicts_the_oldest_stalled_body(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eviction, "EVICT_AFTER", 0.2)

    async def scenario() -> None:
        limits = ServingLimits(max_message_bytes=1 << 20, request_memory_bytes=16 << 20,
                               receive_timeout=30)
        admission = Admission(limits)
        big = limits.largest_request_cost
        first, second = Context("ipv4:10.0.0.2:1"), Context("ipv4:10.0.0.3:1")
        held = [asyncio.create_task(_held(admission, first))]
        await asyncio.sleep(0.05)
        held.append(asyncio.create_task(_held(admission, second)))
        await asyncio.sleep(0.05)
        assert admission.reserved == 2 * big  # the network's half: full

        fresh = Context("ipv4:10.0.0.1:1")
        fresh.arrived.set()
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with admission.request(fresh) as body:
            waited = loop.time() - start
            assert body == [b"x"]
        assert waited < 5  # not the 30 s receive deadline

        done, pending = await asyncio.wait(held, timeout=1)
        assert held[0] in done and held[1] in pending  # the oldest went, the other holds
        with pytest.raises(Refused) as refused:
            held[0].result()
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "had not arrived" in str(refused.value) and "without pausing" in str(refused.value)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert admission.reserved == 0

    asyncio.run(scenario())

