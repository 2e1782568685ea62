"""Out-of-process defenses across real processes: a defense service, a victim using it through
``--defense remote:address=...``, and this test as the server receiving the update."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import torch

from fedleak.defenses.clip import Clip, ClipConfig
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.remote_defense.wire import assemble_update, update_chunks
from fedleak.harness.victim.process import VictimProcess
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc
from tests.helpers import revealed_clean_update
from tests.paths import REPO

pytestmark = pytest.mark.integration
TOKEN = "remote-defense-token"
MODEL = "mlp:width=32,depth=1"
BASE = ["--dataset", "digits", "--split", "all", "--images", "0-15", "--model", MODEL,
        "--batch-size", "4", "--allow-reveal"]
FEDLEAK = [sys.executable, "-m", "fedleak"]
EXAMPLE = REPO / "examples" / "remote_defense" / "sign_server.py"


def _clean_update(client: VictimClient, round_id: str, params: dict,
                  buffers: dict) -> list[torch.Tensor]:
    return revealed_clean_update(client, round_id, params, buffers, MODEL)


def _close(got: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(got, expected,
                                                                           strict=True))


def test_the_victim_sends_what_the_service_returns_and_survives_its_death() -> None:
    service = VictimProcess(["--defense", "clip:max-norm=0.05"],
                            command=[*FEDLEAK, "defense", "serve"]).start()
    try:
        args = [*BASE, "--defense", f"remote:address={service.address}"]
        with VictimProcess(args, token=TOKEN) as victim, \
                VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            (spec,) = client.describe().defenses
            assert (spec.name, spec.stage) == ("remote", "update")
            assert spec.params["address"] == service.address
            assert spec.params["remote-name"] == "clip"
            assert spec.params["remote.max-norm"] == "0.05"
            params, buffers = client.global_model()
            got = client.compute_update(params, buffers)
            clean = _clean_update(client, got.round_id, params, buffers)
            assert torch.cat([c.flatten() for c in clean]).norm() > 0.5  # clipping acts
            assert _close(got.update, Clip(ClipConfig(0.05)).apply(clean, torch.Generator()))

            service.stop()
            with pytest.raises(VictimError) as err:
                client.compute_update(params, buffers)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"remote defense 'clip' at {service.address} is unreachable" in \
                err.value.details
            assert client.describe().defenses[0].name == "remote"  # still serving
    finally:
        service.stop()


def test_the_standalone_example_defense_signs_the_update() -> None:
    with VictimProcess([], command=[sys.executable, str(EXAMPLE)]) as service:
        args = [*BASE, "--defense", f"remote:address={service.address}", "--defense",
                "prune:p=0.5"]
        with VictimProcess(args, token=TOKEN) as victim, \
                VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            specs = client.describe().defenses
            assert [s.name for s in specs] == ["remote", "prune"]
            assert specs[0].params["remote-name"] == "sign-compression"
            assert specs[0].params["remote.scale"] == "mean-abs"
            params, buffers = client.global_model()
            got = client.compute_update(params, buffers)
            clean = _clean_update(client, got.round_id, params, buffers)
    # scaled sign per tensor (the example's mechanism), then the victim's own prune p = 0.5
    for sent, received in zip(clean, got.update, strict=True):
        kept = received != 0
        assert float(kept.float().mean()) == pytest.approx(0.5, abs=0.02)
        magnitude = sent.abs().double().mean().float()
        expected = torch.sign(sent) * magnitude
        assert torch.allclose(received[kept], expected[kept], rtol=1e-5)


class _Switchable(dpb_grpc.DefenseServiceServicer):
    """Answers correctly (the identity) or with NaNs, as the test says."""

    def __init__(self) -> None:
        self.nan = False

    def Info(self, request: object, context: object) -> dpb.DefenseInfo:
        return dpb.DefenseInfo(name="switchable", params={"mode": "identity"}, stage="update")

    def Defend(self, request_iterator: object, context: object) -> Iterator:
        received = assemble_update(request_iterator)
        scale = float("nan") if self.nan else 1.0
        yield from update_chunks([t * scale for t in received.tensors], received.names)


def test_a_service_returning_nans_fails_the_round_not_the_victim() -> None:
    servicer = _Switchable()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dpb_grpc.add_DefenseServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        args = [*BASE, "--defense", f"remote:address=127.0.0.1:{port}"]
        with VictimProcess(args, token=TOKEN) as victim, \
                VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            params, buffers = client.global_model()
            servicer.nan = True
            with pytest.raises(VictimError) as err:
                client.compute_update(params, buffers)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"remote defense 'switchable' at 127.0.0.1:{port} returned NaN" in \
                err.value.details
            servicer.nan = False
            got = client.compute_update(params, buffers)
            clean = _clean_update(client, got.round_id, params, buffers)
            assert _close(got.update, clean)
    finally:
        server.stop(0)


def test_a_victim_refuses_to_start_without_its_defense_service() -> None:
    done = subprocess.run([*FEDLEAK, "victim", "serve", "--port", "0", "--defense",
                           "remote:address=127.0.0.1:1,connect-timeout=0.5"],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 2
    assert "no defense service answered at 127.0.0.1:1" in done.stderr
