"""What a hostile client gets from a victim: the Score oracle, freezing it, its memory.

Against real victim processes on loopback, prints:

1. the oracle — finite differences on the scored MSE (a grey 8×8 digit, then each pixel raised
   by 0.5: 65 Score calls) with the default budget (calls answered) and with
   ``--score-budget 100`` (PSNR of the image read from rounded scores, and the time);
2. freezing — four concurrent ComputeUpdate calls asking for 10⁶ local epochs (caps raised so
   they would run for hours): how many the victim refuses, how long Describe and the health
   check take meanwhile, how long SIGTERM takes to stop the victim;
3. memory — the victim's resident and peak memory before and after four 250 MB Score calls
   with a made-up round id (refused before the tensor is decoded);
4. across-rounds — the issue-21 oracle: one Score per fresh round on one private photo, with
   the victim's defaults (scores answered before the per-image budget refuses);
5. stalls — 64 calls that never send their request, on a victim and on a defense service: the
   slowest Describe / Info and health answers meanwhile;
6. defend-stream — a 2 GiB Defend stream against ``--max-update-mb 512``, then one stalled at
   256 MiB and cancelled: the service's resident memory;
7. secagg-flood — 30 BeginSecAgg never finished (convnet:width=64, 4 users, 93 MB a round)
   against ``--secagg-memory-mb 512``: the victim's resident memory.

    .venv/bin/python bench/hostile_requests.py                     # every part
    .venv/bin/python bench/hostile_requests.py stalls defend-stream  # some
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedleak.harness.attacker.client import VictimClient, VictimError  # noqa: E402
from fedleak.harness.shared.metrics import psnr_per_image  # noqa: E402
from fedleak.harness.shared.protocol import Protocol  # noqa: E402
from fedleak.harness.victim.process import VictimProcess  # noqa: E402
from fedleak.harness.wire.codec import encode_tensor  # noqa: E402
from fedleak.harness.wire.protocol import protocol_to_pb  # noqa: E402
from fedleak.v1 import defense_pb2 as dpb  # noqa: E402
from fedleak.v1 import defense_pb2_grpc as dpb_grpc  # noqa: E402
from fedleak.v1 import victim_pb2 as pb  # noqa: E402
from fedleak.v1 import victim_pb2_grpc as pb_grpc  # noqa: E402
from tests.test_hostile_client import (  # noqa: E402
    finite_differences,
    fresh_round_finite_differences,
)

TOKEN = "bench-token"
DIGITS = ["--dataset", "digits", "--split", "all", "--images", "0-3", "--model",
          "mlp:width=16,depth=1", "--batch-size", "1", "--allow-reveal"]


def oracle() -> None:
    for budget in (1, 100):
        args = [*DIGITS, "--score-budget", str(budget), "--image-score-budget",
                str(max(budget, 8))]
        with VictimProcess(args, token=TOKEN) as victim, \
                VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            params, buffers = client.global_model()
            got = client.compute_update(params, buffers)
            started = time.perf_counter()
            image, accepted, refusal = finite_differences(client, got.round_id, (1, 1, 8, 8))
            wall = time.perf_counter() - started
            truth, _ = client.reveal(got.round_id)
        if image is None:
            print(f"oracle, --score-budget {budget}: {accepted} of 65 calls answered, then "
                  f"{refusal.code.name if refusal else '?'}")
        else:
            psnr = float(psnr_per_image(image, truth)[0])
            grey = float(psnr_per_image(torch.full_like(truth, 0.5), truth)[0])
            print(f"oracle, --score-budget {budget}: {accepted} calls answered, image read at "
                  f"{psnr:.1f} dB (a grey guess: {grey:.1f} dB) in {wall:.2f} s")


def _timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - started


def freezing() -> None:
    args = ["--dataset", "photos", "--split", "all", "--images", "0-1", "--model", "lenet-zhu",
            "--max-local-epochs", "1000000", "--max-local-steps", "1000000"]
    with VictimProcess(args) as victim, VictimClient(victim.address, timeout=60) as client:
        params, buffers = client.global_model()
        request = pb.ComputeUpdateRequest(
            parameters=[encode_tensor(t, n) for n, t in params.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()],
            protocol=protocol_to_pb(Protocol("fedavg", 1_000_000, 1, 1e-4)))
        codes: list[str] = []

        def long_call() -> None:
            try:
                client.stub.ComputeUpdate(request, timeout=10)
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(err.code().name)

        threads = [threading.Thread(target=long_call) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1)
        describe = _timed(client.describe)
        with grpc.insecure_channel(victim.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            health = _timed(lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=10))
        for thread in threads:
            thread.join()
        print(f"freezing: 4 calls of 10^6 local epochs -> {sorted(codes)}; Describe "
              f"{describe * 1000:.0f} ms, health {health * 1000:.0f} ms meanwhile")
        threading.Thread(target=long_call, daemon=True).start()
        time.sleep(1)
        started = time.perf_counter()
        os.kill(victim.pid, signal.SIGTERM)
        assert victim._proc is not None
        victim._proc.wait(timeout=60)
        print(f"freezing: SIGTERM during a computation stopped the victim in "
              f"{time.perf_counter() - started:.2f} s")


def _memory(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def memory() -> None:
    with VictimProcess([*DIGITS, "--max-message-mb", "512"], token=TOKEN) as victim, \
            VictimClient(victim.address, timeout=120, max_message_bytes=512 << 20) as client:
        before = _memory(victim.pid)
        big = encode_tensor(torch.zeros(250 << 18), "images")  # 250 MB of float32
        codes = []
        for _ in range(4):
            try:
                client.stub.Score(pb.ScoreRequest(round_id="made-up", images=big), timeout=120)
            except grpc.RpcError as err:
                codes.append(err.code().name)
        after = _memory(victim.pid)
    print(f"memory: 4 Score calls of 250 MB with a made-up round id -> {sorted(set(codes))}; "
          f"victim RSS {before[0]:.0f} -> {after[0]:.0f} MB, peak {after[1]:.0f} MB")


def oracle_across_rounds() -> None:
    """The issue-21 attack: one Score per fresh round on the same private photo (defaults)."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0", "--model", "lenet-zhu"]
    with VictimProcess(args) as victim, VictimClient(victim.address, timeout=60) as client:
        answered, refusal = fresh_round_finite_differences(client, (1, 3, 32, 32))
        left = client.describe().image_scores_left
    print(f"oracle across rounds, defaults: {answered} scores answered for the one private "
          f"photo (the attack needs 3,073 for one pass), then "
          f"{refusal.code.name if refusal else 'none refused'}; Describe: {left} left")


def stalls(count: int = 64, seconds: float = 5.0) -> None:
    """``count`` calls that never send their request, on a victim and a defense service; the
    slowest Describe / Info and health answers meanwhile."""
    release = threading.Event()

    def never():  # type: ignore[no-untyped-def]
        release.wait(60)
        yield from ()

    identity = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    victim = VictimProcess(DIGITS, token=TOKEN)
    service = VictimProcess(["--defense", "clip:max-norm=1"],
                            command=[sys.executable, "-m", "fedleak", "defense", "serve"])
    with victim, service:
        for name, process, method, probe in (
                ("victim", victim, "/fedleak.v1.Victim/ComputeUpdate", "Describe"),
                ("defense service", service, "/fedleak.v1.DefenseService/Defend", "Info")):
            with grpc.insecure_channel(process.address) as stall, \
                    grpc.insecure_channel(process.address) as channel:
                calls = [stall.stream_unary(method, **identity).future(never(), timeout=60)
                         for _ in range(count)]
                time.sleep(0.5)
                health = health_pb2_grpc.HealthStub(channel)
                check = functools.partial(health.Check, health_pb2.HealthCheckRequest(),
                                          timeout=1)
                if probe == "Describe":
                    own = lambda: pb_grpc.VictimStub(channel).Describe(  # noqa: E731
                        pb.DescribeRequest(), timeout=1)
                else:
                    own = lambda: dpb_grpc.DefenseServiceStub(channel).Info(  # noqa: E731
                        dpb.DefenseInfoRequest(), timeout=1)
                slowest = {probe: 0.0, "health": 0.0}
                answered = 0
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    slowest[probe] = max(slowest[probe], _timed(own))
                    slowest["health"] = max(slowest["health"], _timed(check))
                    answered += 2
                    time.sleep(0.1)
                release.set()
                for call in calls:
                    call.cancel()
                release.clear()
            print(f"stalls: {count} stalled calls on the {name}: {answered} probes answered in "
                  f"{seconds:.0f} s, slowest {probe} {slowest[probe] * 1000:.0f} ms, health "
                  f"{slowest['health'] * 1000:.0f} ms")


def secagg_flood(rounds: int = 30, budget_mb: int = 512) -> None:
    """BeginSecAgg ``rounds`` times without finishing a round (convnet:width=64, 4 users: 93 MB
    of updates a round): the victim's resident memory against ``--secagg-memory-mb``."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0-7", "--model",
            "convnet:width=64", "--users", "4", "--defense", "secagg:threshold=3",
            "--secagg-memory-mb", str(budget_mb)]
    with VictimProcess(args) as victim, VictimClient(victim.address, timeout=300) as client:
        params, buffers = client.global_model()
        first = client.begin_secagg(params, buffers)
        before = _memory(victim.pid)
        started = time.perf_counter()
        for _ in range(rounds):
            client.begin_secagg(params, buffers)
        wall = time.perf_counter() - started
        after = _memory(victim.pid)
        try:
            client.secagg_step(first.round_id, 0, pb.ADVERTISE_KEYS, b"")
            oldest = "OK"
        except VictimError as err:
            oldest = err.code.name
    print(f"secagg flood: {rounds} unfinished rounds in {wall:.0f} s with --secagg-memory-mb "
          f"{budget_mb}: victim RSS {before[0]:.0f} -> {after[0]:.0f} MB (peak {after[1]:.0f} "
          f"MB); the first round's step -> {oldest}")


def defend_stream(total_gib: int = 2, cap_mb: int = 512) -> None:
    """A ``total_gib`` GiB Defend stream against ``--max-update-mb cap_mb``, then one that
    stalls at half the cap and is cancelled by its client: the service's resident memory."""
    command = [sys.executable, "-m", "fedleak", "defense", "serve"]
    block = bytes(1 << 20)
    chunks_total = total_gib << 10
    half = threading.Event()
    release = threading.Event()

    def chunks(count: int, stall_at: int | None = None):  # type: ignore[no-untyped-def]
        for i in range(count):
            if i == stall_at:
                half.set()
                release.wait(60)
                return
            yield dpb.UpdateChunk(piece=pb.Tensor(name="w", dtype=pb.FLOAT32,
                                                  shape=[chunks_total << 18], data=block),
                                  offset=i << 20)

    with VictimProcess(["--defense", "clip:max-norm=1", "--max-update-mb", str(cap_mb)],
                       command=command) as service, \
            grpc.insecure_channel(service.address) as channel:
        stub = dpb_grpc.DefenseServiceStub(channel)
        before = _memory(service.pid)
        started = time.perf_counter()
        try:
            list(stub.Defend(chunks(chunks_total), timeout=300))
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        wall = time.perf_counter() - started
        time.sleep(1)
        refused = _memory(service.pid)
        call = stub.Defend(chunks(chunks_total, stall_at=cap_mb // 2), timeout=300)
        half.wait(60)
        time.sleep(3)  # the server has read what was sent
        held = _memory(service.pid)
        call.cancel()
        release.set()
        time.sleep(3)
        cancelled = _memory(service.pid)
    print(f"defend stream: {total_gib} GiB against --max-update-mb {cap_mb} -> {code} in "
          f"{wall:.1f} s; service RSS {before[0]:.0f} MB before, {refused[0]:.0f} MB after the "
          f"refusal (peak {refused[1]:.0f} MB); a stream of {cap_mb // 2} MiB stalled: "
          f"{held[0]:.0f} MB, after its client cancelled: {cancelled[0]:.0f} MB (peak "
          f"{cancelled[1]:.0f} MB)")


if __name__ == "__main__":
    torch.set_num_threads(1)
    parts = {"oracle": oracle, "across-rounds": oracle_across_rounds, "freezing": freezing,
             "memory": memory, "stalls": stalls, "secagg-flood": secagg_flood,
             "defend-stream": defend_stream}
    chosen = sys.argv[1:] or list(parts)
    for part in chosen:
        parts[part]()
