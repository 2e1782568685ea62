"""Hostile load on a victim (issue 31): what one client can make it hold, and for how long.

- refused requests leave nothing for the garbage collector (the abort exception of gRPC's
  asyncio server had kept every refused request alive in a reference cycle);
- request bodies in flight share a memory budget, reserved before a body is read;
- one client host has a cap on calls in flight and on connections, and a request body has a
  deadline; ``Describe`` and health answer a fresh connection throughout;
- the open-file limit is raised at start, with a warning naming the figure when it stays low;
- ``Describe`` publishes the caps and says that round ids are bearer tokens; a victim bound
  beyond loopback requires the score token unless told otherwise; ``--host ::1`` binds.

Calls and messages are few and small; nothing here measures time (the bench does:
``bench/hostile_requests.py``).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedleak.harness.cli.victim.serving_options import (
    DEFAULT_MAX_CALLS_PER_PEER,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_RECEIVE_TIMEOUT,
)
from fedleak.harness.cli.victim.victim_serving import required_score_token
from fedleak.harness.victim.process import FEDLEAK_COMMAND, VictimProcess
from fedleak.harness.victim.server import MIN_MESSAGE_BYTES, start_server
from fedleak.harness.victim.settings import VictimSettings, create_victim
from fedleak.harness.wire import admission as admission_module
from fedleak.harness.wire.admission import (
    Admission,
    Refused,
    ServingLimits,
    address_prefix,
    peer_host,
)
from fedleak.harness.wire.codec import encode_tensor
from fedleak.harness.wire.connections import (
    Connection,
    OpenFiles,
    connection_ceiling,
    connection_quota,
    excess_connections,
    open_file_warning,
)
from fedleak.harness.wire.serving import host_port, is_loopback
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc
from tests.paths import REPO
from tests.raw_http2 import closed_by_server, idle_connection, stalled_call, unary_call

DIGITS = ["--dataset", "digits", "--split", "all", "--images", "0-3", "--model",
          "mlp:width=16,depth=1", "--batch-size", "1"]
IDENTITY = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)


# -- the caps, in-process ---------------------------------------------------------------------

class FakeContext:
    """The two things :class:`Admission` asks of a gRPC context: who calls, and the body."""

    def __init__(self, peer: str, body: bytes = b"x") -> None:
        self._peer = peer
        self.body = body
        self.arrived = asyncio.Event()
        self.reads = 0

    def peer(self) -> str:
        return self._peer

    async def read(self) -> bytes:
        self.reads += 1
        await self.arrived.wait()
        return self.body


def test_cli_defaults_are_the_servers() -> None:
    assert DEFAULT_MAX_CALLS_PER_PEER == admission_module.DEFAULT_MAX_CALLS_PER_PEER
    assert DEFAULT_MAX_CONNECTIONS_PER_PEER == admission_module.DEFAULT_MAX_CONNECTIONS_PER_PEER
    assert DEFAULT_RECEIVE_TIMEOUT == admission_module.DEFAULT_RECEIVE_TIMEOUT


def test_peer_hosts() -> None:
    assert peer_host("ipv4:10.0.0.5:5000") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("ipv6:%5B::1%5D:5000") == "::1"
    assert peer_host("ipv6:[::ffff:127.0.0.1]:5000") == "127.0.0.1"
    assert peer_host("unix:/tmp/socket") == "unix"


def test_calls_per_peer_are_capped_and_given_back() -> None:
    async def scenario() -> None:
        admission = Admission(ServingLimits(max_calls_per_peer=2))
        one, two = FakeContext("ipv4:10.0.0.5:1"), FakeContext("ipv4:10.0.0.5:2")
        async with admission.call(one), admission.call(two):
            with pytest.raises(Refused) as refused:
                async with admission.call(FakeContext("ipv4:10.0.0.5:3")):
                    pass
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-calls-per-peer 2" in refused.value.details
            async with admission.call(FakeContext("ipv4:10.0.0.6:1")):  # another host
                pass
            async with admission.call(FakeContext("ipv4:10.0.0.5:4"), counted=False):
                assert admission.busy_connections() == {("10.0.0.5", 1), ("10.0.0.5", 2),
                                                        ("10.0.0.5", 4)}
        assert admission.calls_of("10.0.0.5") == 0 and not admission.busy_connections()

    asyncio.run(scenario())


def test_request_bodies_wait_unread_while_the_budget_is_full() -> None:
    """Room for one largest request: a second call does not read its body until the first
    ends, and then does; a third that waits past the deadline is refused."""

    async def scenario() -> None:
        limits = ServingLimits(max_message_bytes=1 << 20, request_memory_bytes=4 << 20,
                               receive_timeout=30)
        admission = Admission(limits)
        first, second = FakeContext("ipv4:1.1.1.1:1", bytes(1 << 20)), \
            FakeContext("ipv4:1.1.1.1:2", bytes(100))
        first.arrived.set()
        second.arrived.set()
        inside = asyncio.Event()
        leave = asyncio.Event()

        async def hold(context: FakeContext) -> int:
            async with admission.request(context) as body:
                inside.set()
                await leave.wait()
                return len(body.pop())

        holder = asyncio.create_task(hold(first))
        await inside.wait()
        assert admission.reserved == 4 << 20  # 4 copies of its 1 MiB body
        waiter = asyncio.create_task(hold(second))
        for _ in range(20):
            await asyncio.sleep(0)
        assert second.reads == 0  # not read: its bytes stay with the client
        leave.set()
        assert await holder == 1 << 20 and await waiter == 100
        assert admission.reserved == 0

        short = Admission(ServingLimits(max_message_bytes=1 << 20,
                                        request_memory_bytes=4 << 20, receive_timeout=0.05))
        admission = short
        leave.clear()
        inside.clear()
        holder = asyncio.create_task(hold(first))  # holds the whole budget until told
        await inside.wait()
        with pytest.raises(Refused) as refused:
            async with short.request(FakeContext("ipv4:1.1.1.1:4")):
                pass
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--request-memory-mb" in refused.value.details
        leave.set()
        await holder
        with pytest.raises(Refused) as late:  # budget free, but the body never comes
            async with short.request(FakeContext("ipv4:1.1.1.1:5")):
                pass
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--receive-timeout" in late.value.details
        assert short.reserved == 0

    asyncio.run(scenario())


def test_one_host_cannot_hold_the_whole_budget() -> None:
    """A host whose body stalls holds at most half the budget: its own next body waits, another
    host's is read at once."""

    async def scenario() -> None:
        admission = Admission(ServingLimits(max_message_bytes=1 << 20,
                                            request_memory_bytes=8 << 20, receive_timeout=30))
        stalled = FakeContext("ipv4:1.1.1.1:1")  # its body never comes
        holder = asyncio.create_task(admission.request(stalled).__aenter__())
        while admission.reserved == 0:
            await asyncio.sleep(0)
        same, other = FakeContext("ipv4:1.1.1.1:2", b"x"), FakeContext("ipv4:2.2.2.2:1", b"y")
        same.arrived.set()
        other.arrived.set()
        waiting = asyncio.create_task(admission.request(same).__aenter__())
        async with admission.request(other) as body:
            assert body == [b"y"]
        for _ in range(20):
            await asyncio.sleep(0)
        assert same.reads == 0 and not waiting.done()
        holder.cancel()
        assert await waiting == [b"x"]

    asyncio.run(scenario())


async def _stalled_request(admission: Admission, context: FakeContext) -> None:
    """A call, as the server makes it, whose body has not come (or is held once in)."""
    async with admission.call(context, counted=False), admission.request(context):
        await asyncio.Event().wait()


def test_two_hosts_of_one_prefix_share_half_and_fresh_clients_keep_a_reserve() -> None:
    """Budget 4 × L: two stalled hosts of 10.0.0.0/24 hold L each (the prefix's half); a host
    of another network is read at once; a second network fills to 3 L; the last L is for a
    host that holds nothing (fresh), not for a held host's next call."""

    async def scenario() -> None:
        limits = ServingLimits(max_message_bytes=1 << 20, request_memory_bytes=16 << 20,
                               receive_timeout=30)
        admission = Admission(limits)
        big = limits.largest_request_cost

        async def hold(peer: str) -> asyncio.Task[None]:
            task = asyncio.create_task(_stalled_request(admission, FakeContext(peer)))
            for _ in range(5):
                await asyncio.sleep(0)
            return task

        held = [await hold("ipv4:10.0.0.2:1"), await hold("ipv4:10.0.0.3:1")]
        assert admission.reserved == 2 * big
        held.append(await hold("ipv4:10.0.0.4:1"))  # a third host of the network waits
        assert admission.reserved == 2 * big
        assert admission.connection_calls()[("10.0.0.4", 1)] is False  # stalled, evictable
        held.append(await hold("ipv4:10.0.1.2:1"))  # another network: its share
        assert admission.reserved == 3 * big
        held.append(await hold("ipv4:10.0.1.2:2"))  # a held host: not into the reserve
        assert admission.reserved == 3 * big
        fresh = FakeContext("ipv4:10.0.2.9:1", b"z")
        fresh.arrived.set()
        async with admission.request(fresh) as body:  # a fresh client takes the reserve
            assert body == [b"z"]
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert admission.reserved == 0 and admission.connection_calls() == {}

    asyncio.run(scenario())


def test_a_call_waiting_for_memory_counts_as_stalled() -> None:
    """A call blocked before its reservation has not read its body: its connection is
    stalled (evictable), not at work — and giving up leaves nothing reserved."""

    async def scenario() -> None:
        admission = Admission(ServingLimits(max_message_bytes=1 << 20,
                                            request_memory_bytes=4 << 20, receive_timeout=0.2))
        first = asyncio.create_task(_stalled_request(admission, FakeContext("ipv4:1.1.1.1:1")))
        while admission.reserved == 0:
            await asyncio.sleep(0)
        second = FakeContext("ipv4:1.1.1.1:2")
        waiting = asyncio.create_task(_stalled_request(admission, second))
        for _ in range(5):
            await asyncio.sleep(0)
        assert second.reads == 0
        assert admission.connection_calls() == {("1.1.1.1", 1): False, ("1.1.1.1", 2): False}
        with pytest.raises(Refused):
            await waiting
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert admission.reserved == 0

    asyncio.run(scenario())


def test_a_budget_below_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="--request-memory-mb"):
        ServingLimits(max_message_bytes=64 << 20, request_memory_bytes=100 << 20)
    limits = ServingLimits(max_message_bytes=64 << 20)
    assert limits.request_memory == 4 * 4 * (64 << 20)
    assert limits.request_memory_per_prefix == 2 * 4 * (64 << 20)
    assert limits.request_memory_reserve == 4 * (64 << 20)


def test_excess_connections_are_the_oldest_idle_ones_of_a_host() -> None:
    held = [Connection("10.0.0.5", port, inode, fd=0)
            for port, inode in ((1, 10), (2, 11), (3, 12), (4, 13), (5, 14))]
    other = [Connection("10.0.0.6", 9, 99, fd=0)]
    closing = excess_connections(held + other, cap=2, busy={("10.0.0.5", 1)})
    assert [c.port for c in closing] == [2, 3, 4]  # port 1 carries a call; 5 is the newest
    assert excess_connections(held + other, cap=5, busy=set()) == []
    # older ones first (in the order a sweep first saw them); one first seen in this sweep
    # only when the host opened more than its cap since the last sweep (a reopening flood)
    seen = {10: 3, 11: 1, 12: 2, 13: 3, 14: 1}
    closing = excess_connections(held, cap=2, busy=set(), first_seen=seen, sweep=3)
    assert sorted(c.port for c in closing) == [2, 3, 5]
    closing = excess_connections(held, cap=1, busy=set(), first_seen=seen, sweep=3)
    assert sorted(c.port for c in closing) == [1, 2, 3, 5]  # the flood's newest but one too


def test_stalled_connections_go_after_idle_ones_and_working_ones_never() -> None:
    held = [Connection("10.0.0.5", port, 10 + port, fd=0) for port in range(1, 7)]
    calls = {("10.0.0.5", 1): False, ("10.0.0.5", 2): False, ("10.0.0.5", 3): True}
    stalled = [a for a, at_work in calls.items() if not at_work]
    closing = excess_connections(held, cap=3, busy=calls, stalled=stalled)
    assert sorted(c.port for c in closing) == [4, 5, 6]  # the idle ones
    closing = excess_connections(held, cap=1, busy=calls, stalled=stalled)
    assert sorted(c.port for c in closing) == [1, 2, 4, 5, 6]  # port 3 is at work


def test_address_prefixes_and_the_caps_per_prefix() -> None:
    assert address_prefix("10.1.2.3") == "10.1.2.0/24"
    assert address_prefix("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert address_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert address_prefix("fe80::1%eth0") == "fe80::/64" and address_prefix("unix") == "unix"
    # sixty hosts of one /24, each within its own cap, are held to the prefix's cap
    held = [Connection(f"10.0.0.{h}", p, 100 * h + p, fd=0) for h in range(2, 62)
            for p in range(4)]
    closing = excess_connections(held, cap=4, busy=set(), per_prefix=16)
    assert len(held) - len(closing) == 16
    other = [Connection("10.9.9.9", 1, 1, fd=0)]
    assert other[0] not in excess_connections(held + other, cap=4, busy=set(), per_prefix=16)
    limits = ServingLimits(max_calls_per_peer=3, max_connections_per_peer=5)
    assert (limits.calls_per_prefix, limits.connections_per_prefix) == (12, 20)
    with pytest.raises(ValueError, match="--max-calls-per-prefix .* at least"):
        ServingLimits(max_calls_per_peer=3, max_calls_per_prefix=2)


def test_the_ceiling_takes_from_the_prefix_holding_most_and_keeps_a_reserve() -> None:
    flood = [Connection(f"10.0.0.{h}", p, 1000 + 10 * h + p, fd=0) for h in range(2, 12)
             for p in range(5)]
    user = [Connection("192.168.1.7", 1, 5, fd=0), Connection("192.168.1.7", 2, 6, fd=0)]
    closing = excess_connections(user + flood, cap=64, busy=set(), ceiling=30)
    assert len(closing) == 22 and not set(closing) & set(user)
    assert connection_quota(1024) == 768 and connection_ceiling(1024) == 576
    assert connection_ceiling(1 << 20) < connection_quota(1 << 20)


def test_calls_per_prefix_are_capped_across_hosts() -> None:
    async def scenario() -> None:
        admission = Admission(ServingLimits(max_calls_per_peer=2, max_calls_per_prefix=3))
        async with admission.call(FakeContext("ipv4:10.0.0.5:1")), \
                admission.call(FakeContext("ipv4:10.0.0.5:2")), \
                admission.call(FakeContext("ipv4:10.0.0.6:1")):
            with pytest.raises(Refused) as refused:
                async with admission.call(FakeContext("ipv4:10.0.0.7:1")):
                    pass
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "10.0.0.0/24" in refused.value.details
            assert "--max-calls-per-prefix 3" in refused.value.details
            async with admission.call(FakeContext("ipv4:10.0.1.7:1")):  # another /24
                pass
        async with admission.call(FakeContext("ipv4:10.0.0.7:1")):  # given back
            pass

    asyncio.run(scenario())


def test_a_connection_waiting_for_its_body_counts_as_stalled() -> None:
    async def scenario() -> None:
        admission = Admission(ServingLimits(receive_timeout=30))
        waiting = FakeContext("ipv4:10.0.0.5:1")
        entered = asyncio.Event()

        async def describe() -> None:
            async with admission.call(waiting, counted=False):
                entered.set()
                await admission.small_request(waiting, "DescribeRequest")

        task = asyncio.create_task(describe())
        await entered.wait()
        await asyncio.sleep(0.01)
        assert admission.connection_calls() == {("10.0.0.5", 1): False}
        waiting.arrived.set()
        await task
        assert admission.connection_calls() == {}

    asyncio.run(scenario())


def test_a_low_open_file_limit_is_named() -> None:
    warning = open_file_warning(OpenFiles(soft=1024, hard=1024, before=1024))
    assert warning is not None and "1024" in warning and "768 connections" in warning
    assert open_file_warning(OpenFiles(soft=65536, hard=65536, before=1024)) is None


def test_hosts_and_loopback() -> None:
    assert host_port("::1", 0) == "[::1]:0" and host_port("[::1]", 5) == "[::1]:5"
    assert host_port("127.0.0.1", 5) == "127.0.0.1:5"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("no-such-host.invalid")


def test_a_victim_others_can_reach_requires_the_score_token() -> None:
    token, made_up = required_score_token("0.0.0.0", None, open_score=False)
    assert token and made_up
    assert required_score_token("0.0.0.0", None, open_score=True) == (None, False)
    assert required_score_token("0.0.0.0", "given", open_score=False) == ("given", False)
    assert required_score_token("127.0.0.1", None, open_score=False) == (None, False)


# -- refused requests release their memory at once ------------------------------------------------

def test_refused_requests_leave_nothing_for_the_collector(one_torch_thread: None) -> None:
    """Refused Score and ComputeUpdate calls: afterwards the cycle collector finds no request
    and no call state (before the fix it found every refused request and gRPC's RPCState)."""
    victim = create_victim(VictimSettings(dataset="digits", split="all", images="0-3",
                                          model="mlp:width=16,depth=1"))
    server, port = start_server(victim, "127.0.0.1", 0, max_message_bytes=8 << 20)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_send_message_length", 8 << 20)]) as channel:
            stub = pb_grpc.VictimStub(channel)
            stub.Describe(pb.DescribeRequest(), timeout=30)
            images = encode_tensor(torch.zeros(1 << 19), "images")  # 2 MiB
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            codes = []
            for request, method in (
                    (pb.ScoreRequest(round_id="made-up", images=images), stub.Score),
                    (pb.ScoreRequest(round_id="made-up", images=images), stub.Score),
                    (pb.ComputeUpdateRequest(parameters=[images]), stub.ComputeUpdate)):
                with pytest.raises(grpc.RpcError) as refused:
                    method(request, timeout=30)
                codes.append(refused.value.code())
            garbage_calls = channel.unary_unary("/fedleak.v1.Victim/Score", **IDENTITY)
            with pytest.raises(grpc.RpcError) as garbage:
                garbage_calls(b"\x08" + b"\xff" * 11, timeout=30)
            codes.append(garbage.value.code())
            assert server.admission is not None
            _wait_for(lambda: server.admission.reserved == 0)
            gc.collect()
            kept = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        server.stop(None).wait(60)
    assert codes == [grpc.StatusCode.NOT_FOUND] * 2 + [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert not kept & {"ScoreRequest", "ComputeUpdateRequest", "RPCState", "AbortError",
                       "Aborted", "_ServicerContext"}, kept


def _wait_for(condition: object, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


# -- caps on a victim process -------------------------------------------------------------------

@pytest.fixture(scope="module")
def capped_victim() -> Iterator[VictimProcess]:
    """A victim on IPv6 loopback with small caps: 2 calls and 4 connections per client host,
    bodies within 2 s."""
    args = [*DIGITS, "--host", "::1", "--max-calls-per-peer", "2",
            "--max-connections-per-peer", "4", "--receive-timeout", "2"]
    with VictimProcess(args) as victim:
        yield victim


def _stall(channel: grpc.Channel, method: str, release: threading.Event) -> grpc.Future:
    def never() -> Iterator[bytes]:
        release.wait(60)
        yield from ()

    return channel.stream_unary(method, **IDENTITY).future(never(), timeout=60)


@pytest.mark.integration
def test_a_client_over_its_calls_is_refused_and_stalled_bodies_end(
        capped_victim: VictimProcess) -> None:
    assert capped_victim.address.startswith("[::1]:")  # --host ::1 --port 0 bound
    release = threading.Event()
    with grpc.insecure_channel(capped_victim.address) as stalls, \
            grpc.insecure_channel(capped_victim.address,
                                  options=[("grpc.use_local_subchannel_pool", 1)]) as fresh:
        calls = [_stall(stalls, "/fedleak.v1.Victim/ComputeUpdate", release) for _ in range(3)]
        try:
            _wait_for(lambda: any(c.done() for c in calls))
            first_done = next(c for c in calls if c.done())
            assert first_done.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-calls-per-peer 2" in first_done.details()
            described = pb_grpc.VictimStub(fresh).Describe(pb.DescribeRequest(), timeout=60)
            assert described.limits.max_calls_per_peer == 2
            health = health_pb2_grpc.HealthStub(fresh)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=60).status == \
                health_pb2.HealthCheckResponse.SERVING
            stalled = [c for c in calls if c is not first_done]
            for call in stalled:  # the receive deadline ends them, whatever the client does
                assert call.exception(timeout=300) is not None
                assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert "--receive-timeout" in call.details()
        finally:
            release.set()
            for call in calls:
                call.cancel()
        stub = pb_grpc.VictimStub(fresh)
        global_model = stub.GetGlobalModel(pb.GetGlobalModelRequest(), timeout=30)
        reply = stub.ComputeUpdate(pb.ComputeUpdateRequest(
            parameters=global_model.parameters, buffers=global_model.buffers), timeout=60)
        assert reply.round_id


@pytest.mark.integration
def test_a_client_over_its_connections_loses_its_oldest_idle_ones(
        capped_victim: VictimProcess) -> None:
    host, port = "::1", int(capped_victim.address.rsplit(":", 1)[1])
    idle = [idle_connection(host, port) for _ in range(12)]
    try:
        def closed() -> int:
            for sock in idle:
                sock.settimeout(0.01)
            return sum(closed_by_server(sock) for sock in idle)

        _wait_for(lambda: closed() >= 8)
        with grpc.insecure_channel(capped_victim.address,
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as fresh:
            assert pb_grpc.VictimStub(fresh).Describe(pb.DescribeRequest(), timeout=60) \
                .num_private_images == 4
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.x sources, /proc")
def test_stalled_describes_are_closed_per_host_and_per_prefix() -> None:
    """Stalled Describe calls (headers, never a body) over a host's cap are closed, and so are
    those of many hosts of one /24 over the prefix's cap; a fresh address is answered."""
    args = [*DIGITS, "--max-connections-per-peer", "4", "--max-connections-per-prefix", "6"]
    describe = "/fedleak.v1.Victim/Describe"
    with VictimProcess(args) as victim:
        port = int(victim.address.rsplit(":", 1)[1])
        one_host = [stalled_call("127.0.0.1", port, describe, source="127.0.0.11")
                    for _ in range(8)]
        many_hosts = [stalled_call("127.0.0.1", port, describe, source=f"127.0.0.{h}")
                      for h in range(2, 6) for _ in range(4)]
        held = one_host + many_hosts
        try:
            def closed(socks: list) -> int:
                for sock in socks:
                    sock.settimeout(0.01)
                return sum(closed_by_server(sock) for sock in socks)

            _wait_for(lambda: closed(held) >= len(held) - 6)  # the /24 holds 6 at most
            answer = unary_call("127.0.0.1", port, describe, source="127.0.0.99", timeout=30)
            assert answer is not None
            assert pb.DescribeResponse.FromString(answer).num_private_images == 4
        finally:
            for sock in held:
                sock.close()


@pytest.mark.integration
def test_describe_publishes_the_caps_and_the_bearer_ids(capped_victim: VictimProcess) -> None:
    with grpc.insecure_channel(capped_victim.address) as channel:
        described = pb_grpc.VictimStub(channel).Describe(pb.DescribeRequest(), timeout=30)
    limits = described.limits
    assert described.max_message_bytes == MIN_MESSAGE_BYTES  # a tiny model: the floor
    assert limits.request_memory_bytes == 4 * 4 * MIN_MESSAGE_BYTES
    assert (limits.max_calls_per_peer, limits.max_connections_per_peer,
            limits.receive_timeout_seconds) == (2, 4, 2.0)
    assert (limits.secagg_memory_bytes, limits.feature_memory_bytes,
            limits.release_memory_bytes) == (1024 << 20, 512 << 20, 512 << 20)
    assert limits.memory_budget_bytes == limits.request_memory_bytes + (2048 << 20)
    assert not described.score_token_required
    assert "bearer tokens" in described.score_access and "--score-token" in \
        described.score_access


@pytest.mark.integration
def test_a_request_over_the_message_limit_is_refused_from_its_length(
        capped_victim: VictimProcess) -> None:
    big = pb.ScoreRequest(round_id="made-up",
                          images=encode_tensor(torch.zeros((MIN_MESSAGE_BYTES >> 2) + 16)))
    with grpc.insecure_channel(capped_victim.address, options=[
            ("grpc.max_send_message_length", 2 * MIN_MESSAGE_BYTES)]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.VictimStub(channel).Score(big, timeout=60)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in refused.value.details()


@pytest.mark.integration
def test_a_victim_bound_beyond_loopback_requires_the_score_token() -> None:
    with VictimProcess([*DIGITS, "--host", "0.0.0.0"]) as victim:
        port = victim.address.rsplit(":", 1)[1]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            described = pb_grpc.VictimStub(channel).Describe(pb.DescribeRequest(), timeout=30)
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.VictimStub(channel).Score(pb.ScoreRequest(round_id="any"), timeout=30)
        made_up = victim.stderr_tail()
    assert described.score_token_required and "requires" in described.score_access
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "score token (give it to the evaluator" in made_up


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit and /proc are Linux")
def test_the_open_file_limit_is_raised_or_named() -> None:
    launcher = ["prlimit", "--nofile=256:300", *FEDLEAK_COMMAND, "victim", "serve"]
    with VictimProcess(DIGITS, command=launcher) as low:
        with grpc.insecure_channel(low.address) as channel:
            pb_grpc.VictimStub(channel).Describe(pb.DescribeRequest(), timeout=30)
        limits = _open_files(low.pid)
        warned = low.stderr_tail()
    assert limits == (300, 300)  # raised to the hard limit
    assert "open-file limit is 300" in warned and "ulimit -n" in warned


def _open_files(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as file:
        line = next(row for row in file if row.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)



def test_the_image_budget_holds_exactly_under_a_race() -> None:
    """Round ids are bearer tokens, but whoever holds them, 32 threads spending at once on one
    image get exactly its budget of answers."""
    from fedleak.harness.victim.scoring.budget import ScoreBudget, ScoreBudgetExhausted

    budget = ScoreBudget(limit=1, image_limit=8)
    start = threading.Barrier(32)
    answered: list[int] = []

    def spend(target: int) -> None:
        start.wait()
        try:
            budget.spend(("round", target), "Score", images=[0])
            answered.append(target)
        except ScoreBudgetExhausted:
            pass

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answered) == 8 and budget.image_scores_left() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_a_child_dies_with_its_fedleak_parent_from_its_first_import(tmp_path) -> None:
    """``import fedleak`` alone arranges it (before any heavy import): the parent is killed
    with SIGKILL, the child (sleeping right after ``import fedleak``) goes with it."""
    import os
    import signal
    import subprocess

    script = ("import os, subprocess, sys, time\n"
              "env = dict(os.environ, FEDLEAK_PARENT_PID=str(os.getpid()))\n"
              "child = subprocess.Popen([sys.executable, '-c', "
              "'import fedleak, time; print(1, flush=True); time.sleep(60)'], env=env,"
              " stdout=subprocess.PIPE)\n"
              "child.stdout.readline()\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())  # type: ignore[union-attr]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(300):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its parent by 30 s")
