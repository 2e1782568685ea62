"""What a hostile client gets from a victim: the Score oracle, freezing it, its memory.

Against real victim processes on loopback, prints:

1. the oracle — finite differences on the scored MSE (a grey 8×8 digit, then each pixel raised
   by 0.5: 65 Score calls) with the default budget (calls answered) and with
   ``--score-budget 100`` (PSNR of the image read from rounded scores, and the time);
2. freezing — four concurrent ComputeUpdate calls asking for 10⁶ local epochs (caps raised so
   they would run for hours): how many the victim refuses, how long Describe and the health
   check take meanwhile, how long SIGTERM takes to stop the victim;
3. memory — the victim's resident and peak memory before and after four 250 MB Score calls
   with a made-up round id (refused before the tensor is decoded).

    .venv/bin/python bench/hostile_requests.py
"""

from __future__ import annotations

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

from fedleak.harness.attacker.client import VictimClient  # noqa: E402
from fedleak.harness.shared.metrics import psnr_per_image  # noqa: E402
from fedleak.harness.shared.protocol import Protocol  # noqa: E402
from fedleak.harness.victim.process import VictimProcess  # noqa: E402
from fedleak.harness.wire.codec import encode_tensor  # noqa: E402
from fedleak.harness.wire.protocol import protocol_to_pb  # noqa: E402
from fedleak.v1 import victim_pb2 as pb  # noqa: E402
from tests.test_hostile_client import finite_differences  # noqa: E402

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


if __name__ == "__main__":
    torch.set_num_threads(1)
    oracle()
    freezing()
    memory()
