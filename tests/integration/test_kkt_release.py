"""Model release over gRPC against real victim processes: the Release stream, KKT scoring in
Score, the ``fedleak attack --attack kkt`` flow, DP releases, cancellation and bad input."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from click.testing import CliRunner

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.cli.main import main
from fedleak.harness.federated.release_training import to_model_input
from fedleak.harness.metrics.kkt_metrics import vote_reconstructions
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.wire.codec import encode_tensor
from fedleak.harness.zoo.binary_tasks import binary_task
from fedleak.harness.zoo.models import build_model
from fedleak.v1 import victim_pb2 as pb
from tests.conftest import TOKEN

pytestmark = pytest.mark.integration

MODEL = "kkt-mlp:width=32,depth=1"
N = 8
CAP = 3000


@pytest.fixture(scope="module")
def kkt_victim() -> Iterator[VictimProcess]:
    args = ["--dataset", "digits", "--images", "0-99", "--model", MODEL, "--release-size",
            str(N), "--release-epochs", str(CAP), "--release-lr", "0.5", "--allow-reveal"]
    with VictimProcess(args, token=TOKEN) as proc:
        yield proc


@pytest.fixture()
def kkt_client(kkt_victim: VictimProcess) -> Iterator[VictimClient]:
    with VictimClient(kkt_victim.address, token=TOKEN, timeout=60) as c:
        yield c


def _expect(call: object, code: grpc.StatusCode, *words: str) -> None:
    with pytest.raises((grpc.RpcError, VictimError)) as info:
        call()  # type: ignore[operator]
    err = info.value
    got = err.code if isinstance(err, VictimError) else err.code()
    details = err.details if isinstance(err, VictimError) else err.details()
    assert got == code, details
    for word in words:
        assert word in details, details


def test_release_streams_progress_and_a_model_trained_on_the_training_set(
    kkt_client: VictimClient,
) -> None:
    described = kkt_client.describe()
    got = kkt_client.release(report_every=100, show_progress=False)
    epochs = [e for e, _, _ in got.history]
    assert epochs[0] == 1 and epochs == sorted(epochs) and len(epochs) >= 2
    assert got.num_train == N and got.input_shape == (1, 8, 8)
    assert got.value_range == (-1.0, 1.0) and "odd" in got.binary_task
    assert got.train_accuracy == 1.0 and got.metadata["dp"] == "false"
    assert got.reached_target or got.epochs == CAP
    assert [(p.name, list(p.shape)) for p in described.parameters] == [
        (name, list(t.shape)) for name, t in got.parameters.items()
    ]
    # The released θ separates the (revealed) training set: y_i Φ(θ; x_i) > 0 for every i,
    # with the margins the victim reports in Score.
    images, labels = kkt_client.reveal(got.release_id)
    assert images.shape == (N, 1, 8, 8)
    y = binary_task("digits")(labels)
    assert sorted(y.tolist()) == [-1.0] * (N // 2) + [1.0] * (N // 2)
    model = build_model(MODEL, (1, 8, 8), 10)
    with torch.no_grad():
        margins = torch.func.functional_call(model, got.parameters,
                                             (to_model_input(images),)).reshape(-1) * y
    assert bool((margins > 0).all())
    score = kkt_client.score_release(got.release_id, images)  # the truth itself: perfect
    assert score.recovered == N and score.recovered_ssim == pytest.approx(0.4)
    assert all(s.matched_index == s.index for s in score.images)
    assert all(s.ssim > 0.999 for s in score.images if s.voters == 1)
    assert [s.margin for s in score.images] == pytest.approx(margins.tolist(), rel=1e-4)
    # each sample beside its floors: the truth itself is far above every constant guess
    assert score.floors_scored and {f.guess for f in score.floors} >= {"grey", "data-set mean"}
    assert all(s.floor_guess and s.floor_psnr + 3 <= s.psnr for s in score.images)
    assert score.above_floor == N and score.successes == N


def test_kkt_attack_from_the_cli_writes_metrics_and_pictures(
    kkt_victim: VictimProcess, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["attack", "--victim", kkt_victim.address, "--attack", "kkt", "--token", TOKEN,
            "--iterations", "150", "--release-epochs", "1500", "--quiet", "--out", str(out),
            "-o", "optimizer=adam", "-o", "runs=2", "-o", "lr-low=0.01", "-o", "lr-high=0.01",
            "-o", "sigma-x-low=0.01", "-o", "sigma-x-high=0.01", "-o", "log-every=50",
            "-o", "pack=2"]  # the two runs as one packed computation
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "recovered" in result.output and "ssim_vs_margin.png" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["threat_model"] == "release" and metrics["attack"] == "kkt"
    assert metrics["release"]["num_train"] == N and metrics["release"]["epochs"] <= 1500
    assert metrics["reconstruction"]["candidates"] == 2 * 2 * N
    samples = metrics["training_samples"]
    assert sorted(s["index"] for s in samples) == list(range(N))
    assert all(-1 <= s["ssim"] <= 1 and s["margin"] > 0 and s["voters"] >= 1 for s in samples)
    recovered = sum(s["ssim"] >= 0.4 for s in samples)
    assert metrics["summary"]["recovered"] == recovered
    floors = metrics["summary"]["floors"]  # every figure beside its floor, in the file and out
    assert floors["images"] == N and "data-set mean" in floors["guesses"]
    assert all(s["floor_psnr"] > 0 and s["floor_guess"] for s in samples)
    above = sum(s["ssim"] >= 0.4 and s["psnr"] >= s["floor_psnr"] + 3 for s in samples)
    assert metrics["summary"]["recovered_above_floor"] == above
    assert "floor (best constant guess per image)" in result.output
    assert f"above the floor: {above}/{N} training samples" in result.output
    assert metrics["local_voting_matches_victim"] is True
    for name in ("ssim_vs_margin.png", "best.png", "candidates.npy"):
        assert (out / name).stat().st_size > 0
    assert "kkt" in CliRunner().invoke(main, ["attack", "--help"]).output
    assert "sigma-x-low" in CliRunner().invoke(main, ["attack", "--help"]).output


def test_bad_release_and_score_requests_are_refused_and_the_victim_keeps_serving(
    kkt_client: VictimClient,
) -> None:
    stub = kkt_client.stub

    def release(**fields: object) -> object:
        return lambda: list(stub.Release(pb.ReleaseRequest(**fields), timeout=30))

    _expect(release(max_epochs=CAP + 1), grpc.StatusCode.INVALID_ARGUMENT, "max_epochs",
            str(CAP))
    _expect(release(learning_rate=-1.0), grpc.StatusCode.INVALID_ARGUMENT, "learning_rate")
    _expect(release(target_loss=math.nan), grpc.StatusCode.INVALID_ARGUMENT, "target_loss")
    _expect(release(report_every=-5), grpc.StatusCode.INVALID_ARGUMENT, "report_every")
    got = kkt_client.release(max_epochs=50, show_progress=False)
    assert got.epochs <= 50
    rid = got.release_id

    def score(images: torch.Tensor, **fields: object) -> object:
        request = pb.ScoreRequest(round_id=rid, images=encode_tensor(images, "images"),
                                  **fields)
        return lambda: stub.Score(request, timeout=30)

    _expect(score(torch.rand(3, 1, 4, 4)), grpc.StatusCode.INVALID_ARGUMENT, "[M, 1, 8, 8]")
    _expect(score(torch.rand(3, 1, 8, 8) * 3), grpc.StatusCode.INVALID_ARGUMENT, "[0, 1]")
    _expect(score(torch.full((2, 1, 8, 8), math.nan)), grpc.StatusCode.INVALID_ARGUMENT, "NaN")
    _expect(score(torch.rand(2, 1, 8, 8), recovered_ssim=2.0),
            grpc.StatusCode.INVALID_ARGUMENT, "recovered_ssim")
    _expect(lambda: stub.Score(pb.ScoreRequest(round_id=rid), timeout=30),
            grpc.StatusCode.INVALID_ARGUMENT, "candidates")
    _expect(lambda: kkt_client.score_release("no-such-release", torch.rand(2, 1, 8, 8)),
            grpc.StatusCode.NOT_FOUND, "round id")
    assert kkt_client.score_release(rid, torch.rand(5, 1, 8, 8)).images
    assert kkt_client.describe().model.name == "kkt-mlp"


def test_cancelling_a_release_stops_training(
    kkt_victim: VictimProcess, kkt_client: VictimClient
) -> None:
    seen: list[int] = []

    def cancel_after_two(message: pb.ReleaseProgress) -> bool:
        seen.append(message.epoch)
        return len(seen) >= 2

    _expect(lambda: kkt_client.release(max_epochs=CAP, target_loss=1e-30, report_every=1,
                                       show_progress=False, on_progress=cancel_after_two),
            grpc.StatusCode.CANCELLED)
    assert seen == [1, 2]
    # Training noticed the cancellation long before its budget, and says so.
    deadline = time.monotonic() + 300  # a load average of 20 on 2 cores is slow
    while not (found := re.search(r"cancelled at epoch (\d+) of (\d+)",
                                  kkt_victim.stderr_tail())):
        assert time.monotonic() < deadline, kkt_victim.stderr_tail()
        time.sleep(0.1)
    assert 2 <= int(found.group(1)) < CAP == int(found.group(2))
    # ... and freed the victim for the next release.
    while True:
        try:
            got = kkt_client.release(max_epochs=20, show_progress=False)
            break
        except VictimError as err:
            assert "already training" in err.details and time.monotonic() < deadline
            time.sleep(0.2)
    assert got.epochs <= 20


def test_dp_release_reports_epsilon() -> None:
    args = ["--dataset", "digits", "--images", "0-39", "--model", MODEL, "--release-size",
            "6", "--release-epochs", "30", "--defense",
            "dpsgd:noise-multiplier=1.0,max-grad-norm=1.0"]
    with VictimProcess(args) as proc, VictimClient(proc.address, timeout=60) as client:
        assert [d.name for d in client.describe().defenses] == ["dpsgd"]
        got = client.release(show_progress=False)
        assert got.metadata["dp"] == "true" and got.epochs == 30
        assert 0 < float(got.metadata["epsilon"]) < math.inf
        assert got.metadata["noise_multiplier"] == "1.0"


def test_release_needs_a_one_output_model(client: VictimClient) -> None:
    """The shared lenet-zhu victim on photos (10 outputs) refuses to release."""
    _expect(lambda: client.release(show_progress=False), grpc.StatusCode.FAILED_PRECONDITION,
            "kkt-mlp")
    assert client.describe().model.name == "lenet-zhu"


def test_voting_averages_the_close_candidates() -> None:
    """App. B.3: candidates with NCC ≥ 0.9 × the best vote; their mean is the reconstruction."""
    torch.manual_seed(0)
    train = torch.rand(2, 1, 6, 6)
    noisy = (train[0] + 0.02 * torch.randn(1, 6, 6)).clamp(0, 1)
    candidates = torch.stack([train[0], noisy, 1 - train[0], torch.rand(1, 6, 6)])
    voted = vote_reconstructions(candidates, train)
    assert int(voted.nearest[0]) == 0 and int(voted.voters[0]) == 2
    assert torch.allclose(voted.reconstructions[0], (train[0] + noisy) / 2)
    assert float(voted.ssim[0]) > 0.9 and voted.recovered(0.9) >= 1
    with pytest.raises(ValueError, match="at least one"):
        vote_reconstructions(candidates[:0], train)


def test_bad_release_flags_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["victim", "serve", "--dataset", "digits", "--model",
                                       MODEL, "--release-size", "1", "--port", "0"])
    assert result.exit_code == 2 and "--release-size" in result.output
    result = CliRunner().invoke(main, ["attack", "--victim", "127.0.0.1:1", "--attack", "kkt",
                                       "--release-epochs", "0"])
    assert result.exit_code == 2 and "--release-epochs" in result.output
