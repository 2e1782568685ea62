"""Raw calls on loopback against a victim and ``fedleak defense serve`` processes.

Clients that open calls and never send their bodies must not silence either service: with
more stalled calls than either has worker threads, health and ``Describe`` / ``Info`` keep
answering, and the services serve normally once the stalls end. How fast they answer is the
bench's figure (``bench/hostile_requests.py stalls``: within a second); here a probe's deadline
is :data:`PROBE_DEADLINE`, which holds at a load average of 20 on 2 cores. Raw garbage
bytes in place of a request are answered ``INVALID_ARGUMENT`` naming the message type (gRPC's
own answer would be ``INTERNAL``).

A stalled call here is a real HTTP/2 stream on loopback: its headers are sent, its request
message never is (the request iterator blocks until the test releases it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.victim.process import VictimProcess
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration
#: Stalled calls per service: eight times the victim's 8 worker threads.
STALLS = 64
#: Seconds the probes run while the calls stall.
PROBE_SECONDS = 3.0
#: A probe's deadline: a behaviour (answered while calls stall), not a speed.
PROBE_DEADLINE = 30.0
VICTIM = ["--dataset", "digits", "--split", "all", "--images", "0-3", "--model",
          "mlp:width=16,depth=1", "--batch-size", "1"]


def _stall(channel: grpc.Channel, methods: list[str], release: threading.Event) \
        -> list[grpc.Future]:
    """Open ``STALLS`` calls cycling over ``methods`` whose request never comes."""

    def never() -> Iterator[bytes]:
        release.wait(60)
        return
        yield b""  # a generator that yields nothing

    calls = []
    for i in range(STALLS):
        call = channel.stream_unary(methods[i % len(methods)],
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        calls.append(call.future(never(), timeout=60))
    return calls


def _probe(probes: dict[str, object]) -> list[float]:
    """Call every probe repeatedly for ``PROBE_SECONDS`` (each with its deadline); the slowest
    answer per round. A probe that misses its deadline raises."""
    slowest = []
    end = time.monotonic() + PROBE_SECONDS
    while time.monotonic() < end:
        worst = 0.0
        for probe in probes.values():
            started = time.monotonic()
            probe()  # type: ignore[operator]
            worst = max(worst, time.monotonic() - started)
        slowest.append(worst)
        time.sleep(0.1)
    return slowest


#: Bytes no protobuf message parses: field 1 as a varint that never ends.
GARBAGE = b"\x08" + b"\xff" * 11


def _garbage(channel: grpc.Channel, method: str, streaming: bool = False) -> grpc.RpcError:
    """The error a call of ``method`` with :data:`GARBAGE` for its request gets."""
    identity = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as refused:
        if streaming:
            list(channel.stream_stream(method, **identity)(iter([GARBAGE]), timeout=30))
        else:
            channel.unary_unary(method, **identity)(GARBAGE, timeout=30)
    return refused.value  # type: ignore[return-value]


def _end(calls: list[grpc.Future], release: threading.Event) -> None:
    release.set()
    for call in calls:
        call.cancel()


def _probe_while_stalled(stalls: grpc.Channel, probes: grpc.Channel, methods: list[str],
                         own: Callable[[], object]) -> None:
    """Stall ``STALLS`` calls of ``methods`` on ``stalls``; on ``probes`` the service's own
    probe (``own``) and health must answer within their deadline for ``PROBE_SECONDS``."""
    release = threading.Event()
    calls = _stall(stalls, methods, release)
    try:
        time.sleep(0.5)  # the stalled streams are opening (they stay stalled either way)
        health = health_pb2_grpc.HealthStub(probes)
        slowest = _probe({
            "own": own,
            "health": lambda: health.Check(health_pb2.HealthCheckRequest(),
                                           timeout=PROBE_DEADLINE),
        })
        assert slowest  # every probe answered (a missed deadline raises)
        for call in calls:  # still stalled throughout; a stalled Describe's body has 10 s
            assert not call.done() or (call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                                       and "small request" in (call.details() or ""))
    finally:
        _end(calls, release)


def test_stalled_calls_do_not_freeze_the_victim() -> None:
    # room for every stalled call of this one client: they must cost no thread
    with VictimProcess([*VICTIM, "--max-calls-per-peer", str(STALLS + 8)]) as victim, \
            grpc.insecure_channel(victim.address) as stalls, \
            grpc.insecure_channel(victim.address) as probes:
        methods = [f"/fedleak.v1.Victim/{m}" for m in
                   ("ComputeUpdate", "Describe", "Score", "BeginSecAgg", "GetGlobalModel")]
        methods.append("/grpc.health.v1.Health/Check")
        stub = pb_grpc.VictimStub(probes)
        _probe_while_stalled(stalls, probes, methods,
                             lambda: stub.Describe(pb.DescribeRequest(),
                                                   timeout=PROBE_DEADLINE))
        with VictimClient(victim.address, timeout=60) as client:  # and it computes again
            params, buffers = client.global_model()
            assert client.compute_update(params, buffers).round_id
        for method, message in (("ComputeUpdate", "ComputeUpdateRequest"),
                                ("Score", "ScoreRequest"), ("Describe", "DescribeRequest"),
                                ("Release", "ReleaseRequest")):
            refused = _garbage(probes, f"/fedleak.v1.Victim/{method}")
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
            assert f"not a valid fedleak.v1.{message} message" in refused.details()


def test_stalled_defend_streams_do_not_freeze_the_defense_service() -> None:
    service = VictimProcess(["--defense", "clip:max-norm=1", "--max-calls-per-peer",
                             str(STALLS + 8)],
                            command=[sys.executable, "-m", "fedleak", "defense", "serve"])
    with service, grpc.insecure_channel(service.address) as stalls, \
            grpc.insecure_channel(service.address) as probes:
        stub = dpb_grpc.DefenseServiceStub(probes)
        _probe_while_stalled(stalls, probes, ["/fedleak.v1.DefenseService/Defend",
                                              "/fedleak.v1.DefenseService/Info"],
                             lambda: stub.Info(dpb.DefenseInfoRequest(),
                                               timeout=PROBE_DEADLINE))
        refused = _garbage(probes, "/fedleak.v1.DefenseService/Defend", streaming=True)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
        assert "not a valid fedleak.v1.UpdateChunk message" in refused.details()
        assert stub.Info(dpb.DefenseInfoRequest(), timeout=PROBE_DEADLINE).name == "clip"
