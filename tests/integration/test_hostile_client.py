"""A hostile client against a real victim process: the Score oracle, frozen victims, tokens,
TLS mix-ups, child processes that outlive their parent, and minority secure aggregation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import psnr_per_image
from fedleak.harness.victim.process import VictimProcess, VictimProcessError
from fedleak.harness.wire.codec import encode_tensor
from fedleak.harness.wire.protocol_spec import protocol_to_pb
from fedleak.v1 import victim_pb2 as pb
from tests.helpers import (
    alive,
    child_pids,
    listening_sockets,
    self_signed_certificate,
    tiny_spec,
)

pytestmark = pytest.mark.integration
TOKEN = "hostile-token"
DIGITS = ["--dataset", "digits", "--split", "all", "--images", "0-3", "--model",
          "mlp:width=16,depth=1", "--batch-size", "1", "--allow-reveal"]


def finite_differences(client: VictimClient, round_id: str, shape: tuple[int, ...],
                       step: float = 0.5) -> tuple[torch.Tensor | None, int, VictimError | None]:
    """The oracle attack: score a grey image, then that image with one pixel raised by
    ``step``, pixel by pixel, and read each pixel from the change of the scored MSE.

    MSE(g + δe_i) − MSE(g) = (2δ(g − x_i) + δ²)/D, so x_i = g + δ/2 − D·ΔMSE_i/(2δ).
    Returns the image read (None if refused), the accepted calls and the refusal.
    """
    grey = torch.full(shape, 0.5)
    pixels = grey[0].numel()
    accepted = 0
    try:
        base = client.score(round_id, grey).mean_mse
        accepted += 1
        read = torch.empty(pixels)
        for i in range(pixels):
            probe = grey.clone().view(-1)
            probe[i] += step
            mse = client.score(round_id, probe.view(shape)).mean_mse
            accepted += 1
            read[i] = 0.5 + step / 2 - pixels * (mse - base) / (2 * step)
    except VictimError as err:
        return None, accepted, err
    return read.clamp(0, 1).view(shape), accepted, None


def test_the_score_oracle_is_refused_after_one_submission() -> None:
    with VictimProcess(DIGITS, token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        assert client.describe().score_budget == 1
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        image, accepted, refusal = finite_differences(client, got.round_id, (1, 1, 8, 8))
        assert image is None and accepted == 1  # 65 calls tried, one answered
        assert refusal is not None and refusal.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "--score-budget" in refusal.details and "final" in refusal.details
        # each round has its own budget: the next round is scored once, too
        second = client.compute_update(params, buffers)
        assert client.score(second.round_id, torch.rand(1, 1, 8, 8)).images
        # labels alone spend the budget like images
        third = client.compute_update(params, buffers)
        assert client.score(third.round_id, None, [0]).labels_scored
        with pytest.raises(VictimError, match="score budget"):
            client.score(third.round_id, torch.rand(1, 1, 8, 8))


def fresh_round_finite_differences(client: VictimClient, shape: tuple[int, ...],
                                   step: float = 0.5) -> tuple[int, VictimError | None]:
    """The oracle across rounds (issue 21): one ``Score`` per fresh round on a pool of one
    private image, a grey image then one pixel raised per round, as :func:`finite_differences`
    does within one round. Returns the scores answered and the refusal."""
    params, buffers = client.global_model()
    grey = torch.full(shape, 0.5)
    answered = 0
    for i in range(grey[0].numel() + 1):
        probe = grey.clone().view(-1)
        if i:
            probe[i - 1] += step
        round_id = client.compute_update(params, buffers).round_id  # a new round, same image
        try:
            client.score(round_id, probe.view(shape))
        except VictimError as err:
            return answered, err
        answered += 1
    return answered, None


def test_the_oracle_across_fresh_rounds_is_refused_by_the_image_budget() -> None:
    """Each fresh round has its own target budget, but not its own private image: the image's
    lifetime budget (default 8) refuses the ninth score of the one image in the pool."""
    from fedleak.harness.cli.victim.game_options import DEFAULT_IMAGE_BUDGET as CLI_DEFAULT
    from fedleak.harness.victim.scoring.budget import DEFAULT_IMAGE_BUDGET

    assert CLI_DEFAULT == DEFAULT_IMAGE_BUDGET == 8
    args = [*DIGITS[:5], "0", *DIGITS[6:]]  # --images 0: every round trains on image 0
    with VictimProcess(args, token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        before = client.describe()
        assert (before.image_score_budget, before.image_scores_left) == (8, 8)
        assert before.images_score_exhausted == 0
        answered, refusal = fresh_round_finite_differences(client, (1, 1, 8, 8))
        after = client.describe()
        # labels alone depend on the image too, and a release-less victim has nothing else
        fresh = client.compute_update(*client.global_model()).round_id
        with pytest.raises(VictimError, match="--image-score-budget"):
            client.score(fresh, None, [0])
    assert answered == 8  # of the 65 the attack needs (one per pixel and the grey base)
    assert refusal is not None and refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "--image-score-budget" in refusal.details and "8 time(s)" in refusal.details
    assert (after.image_scores_left, after.images_score_exhausted) == (0, 1)


def test_the_image_budget_counts_every_target_holding_the_image() -> None:
    """User sets of a secure-aggregation round and releases are new targets, not new images:
    each answer is charged to every image scored; a refusal spends nothing."""
    from fedleak.harness.victim.scoring.budget import ScoreBudget, ScoreBudgetExhausted

    budget = ScoreBudget(limit=1, image_limit=3)
    budget.spend(("round", "r", (0,)), "user 0", [0, 1])
    budget.spend(("round", "r", (1,)), "user 1", [2, 3])
    budget.spend(("round", "r", (0, 1)), "users 0, 1", [0, 1, 2, 3])
    budget.spend(("release", "a"), "release a", [0, 5])
    assert budget.image_scores_left() == 0 and budget.images_exhausted() == 1
    with pytest.raises(ScoreBudgetExhausted, match="1 private image"):
        budget.spend(("release", "b"), "release b", [0, 5])
    with pytest.raises(ScoreBudgetExhausted, match="--score-budget"):
        budget.spend(("release", "a"), "release a", [7])
    budget.spend(("release", "b"), "release b", [5, 6])  # the refusals spent nothing
    assert budget.spent(("release", "b")) == 1 and budget.images_exhausted() == 1
    budget.spend(("round", "s", ()), "round s", [5])  # image 5: release a, b and this round
    assert budget.images_exhausted() == 2


def test_a_raised_budget_is_unsafe_warned_and_the_oracle_reads_the_image() -> None:
    """Rounded scores are no defence: with the budget raised, 65 calls read an 8×8 digit."""
    args = [*DIGITS, "--score-budget", "100", "--image-score-budget", "100"]
    with VictimProcess(args, token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        image, accepted, refusal = finite_differences(client, got.round_id, (1, 1, 8, 8))
        truth, _ = client.reveal(got.round_id)
        warned = victim.stderr_tail()
    assert refusal is None and accepted == 65 and image is not None
    assert "WARNING: --score-budget 100" in warned and "oracle" in warned
    assert "WARNING: --image-score-budget 100" in warned
    assert float(psnr_per_image(image, truth)[0]) > 25  # a grey guess scores about 10 dB


def test_scores_come_at_report_precision() -> None:
    with VictimProcess(DIGITS, token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        score = client.score(got.round_id, torch.rand(1, 1, 8, 8), [3])
    image = score.images[0]
    assert image.psnr == round(image.psnr, 2) and image.ssim == round(image.ssim, 4)
    assert image.mse == float(f"{image.mse:.3g}")
    assert score.mean_psnr == round(score.mean_psnr, 2)


def test_the_evaluator_token_guards_score_and_the_attacker_checks_tokens(tmp_path: Path) -> None:
    env = {**os.environ, "FEDLEAK_SCORE_TOKEN": "evaluator"}
    args = [*DIGITS, "--score-token", "evaluator"]
    with VictimProcess(args, token=TOKEN) as victim:
        with VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            described = client.describe()
            assert described.score_token_required and described.token_accepted
            assert not described.score_token_accepted
            params, buffers = client.global_model()
            got = client.compute_update(params, buffers)
            with pytest.raises(VictimError) as refused:
                client.score(got.round_id, torch.rand(1, 1, 8, 8))
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "x-fedleak-score-token" in refused.value.details
        base = [sys.executable, "-m", "fedleak", "attack", "--victim", victim.address,
                "--iterations", "2", "--quiet"]
        no_score = subprocess.run([*base, "--out", str(tmp_path / "a")], capture_output=True,
                                  text=True, timeout=1200,
                                  env={**os.environ, "FEDLEAK_TOKEN": TOKEN})
        assert no_score.returncode == 1 and "--score-token" in no_score.stderr
        assert not (tmp_path / "a" / "metrics.json").exists()
        token_file = tmp_path / "token"
        token_file.write_text("not-the-token\n")
        wrong = subprocess.run([*base, "--token-file", str(token_file), "--out",
                                str(tmp_path / "b")], capture_output=True, text=True,
                               timeout=1200, env=env)
        assert wrong.returncode == 1 and "is not the token of the victim" in wrong.stderr
        token_file.write_text(TOKEN + "\n")
        right = subprocess.run([*base, "--token-file", str(token_file), "--out",
                                str(tmp_path / "c")], capture_output=True, text=True,
                               timeout=1200, env=env)
        assert right.returncode == 0, right.stderr
        assert (tmp_path / "c" / "round-000" / "comparison.png").exists()


def test_no_token_where_reveal_is_allowed_is_a_recorded_warning(tmp_path: Path) -> None:
    import json

    with VictimProcess(DIGITS, token=TOKEN) as victim:
        run = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                              victim.address, "--iterations", "2", "--quiet", "--out",
                              str(tmp_path)], capture_output=True, text=True, timeout=1200,
                             env={k: v for k, v in os.environ.items() if k != "FEDLEAK_TOKEN"})
    assert run.returncode == 0, run.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert any("no --token" in w for w in metrics["warnings"])
    assert "no --token" in run.stdout


def _long_protocol(epochs: int) -> pb.ProtocolSpec:
    return protocol_to_pb(Protocol("fedavg", epochs, 1, 1e-4))


def _round_request(client: VictimClient, protocol: pb.ProtocolSpec) -> pb.ComputeUpdateRequest:
    params, buffers = client.global_model()
    return pb.ComputeUpdateRequest(
        parameters=[encode_tensor(t, n) for n, t in params.items()],
        buffers=[encode_tensor(t, n) for n, t in buffers.items()], protocol=protocol)


def test_server_chosen_work_is_capped() -> None:
    with VictimProcess(DIGITS, token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        limits = client.describe().limits
        assert limits.max_local_epochs == 100 and limits.max_learning_rate == 10
        for protocol, words in ((_long_protocol(2**31 - 1), "--max-local-epochs"),
                                (protocol_to_pb(Protocol("fedavg", 1, 1, 1e300)), "--max-lr")):
            with pytest.raises(grpc.RpcError) as refused:
                client.stub.ComputeUpdate(_round_request(client, protocol), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in refused.value.details()
        params, buffers = client.global_model()
        assert client.compute_update(params, buffers).update


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=60).status


def test_abandoned_and_excess_computations_do_not_freeze_the_victim() -> None:
    """The freeze of the hostile tester, with caps raised so the work is long: abandoned calls
    stop, a fourth concurrent computation is refused, Describe and health keep answering, and
    SIGTERM stops the victim while it computes."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0-1", "--model", "lenet-zhu",
            "--max-local-epochs", "1000000", "--max-local-steps", "1000000"]
    with VictimProcess(args, token=TOKEN) as victim, \
            VictimClient(victim.address, timeout=60) as client:
        request = _round_request(client, _long_protocol(1_000_000))
        with pytest.raises(grpc.RpcError) as gave_up:  # the client gives up after 1 s
            client.stub.ComputeUpdate(request, timeout=1)
        assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        params, buffers = client.global_model()
        assert client.compute_update(params, buffers).update  # the abandoned one stopped
        codes: list[grpc.StatusCode] = []

        def long_call() -> None:
            try:
                client.stub.ComputeUpdate(request, timeout=8)
            except grpc.RpcError as err:
                codes.append(err.code())

        threads = [threading.Thread(target=long_call) for _ in range(4)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        assert client.describe().model.name == "lenet-zhu"
        assert _health(victim.address) == health_pb2.HealthCheckResponse.SERVING
        for thread in threads:
            thread.join()
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 1  # the one beyond the queue
        assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED,
                              grpc.StatusCode.DEADLINE_EXCEEDED}
        threading.Thread(target=long_call).start()
        time.sleep(1)
        os.kill(victim.pid, signal.SIGTERM)
        assert victim._proc is not None
        assert victim._proc.wait(timeout=300) == 0  # stopped while computing


def _serving_victims(parent: int) -> list[int]:
    """The victim processes ``parent`` started that listen on a port (past start-up, so
    their parent-death signal is armed: it is the first thing a victim does)."""
    victims = []
    for pid in child_pids(parent):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if " victim serve" in command and listening_sockets({pid}):
            victims.append(pid)
    return victims


def test_a_killed_sweep_takes_its_victims_with_it(tmp_path: Path) -> None:
    """Conditions, not sleeps, with deadlines that hold at a load average of 20 on 2 cores
    (starting Python and torch there took minutes): the sweep's victim is serving, the sweep is
    killed with SIGKILL, the victim (SIGTERM from its parent-death signal) stops."""
    spec = tmp_path / "spec.toml"
    spec.write_text(tiny_spec("", iterations=100000, utility_rounds=2))
    sweep = subprocess.Popen([sys.executable, "-m", "fedleak", "sweep", str(spec), "--out",
                              str(tmp_path / "run"), "--quiet", "--no-report"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        victims: list[int] = []
        deadline = time.monotonic() + 600
        while not victims and time.monotonic() < deadline and sweep.poll() is None:
            time.sleep(0.5)
            victims = _serving_victims(sweep.pid)
        assert victims, "the sweep started no victim"
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
        deadline = time.monotonic() + 300
        while any(alive(pid) for pid in victims) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in victims), "a victim outlived the killed sweep"
    finally:
        if sweep.poll() is None:
            sweep.kill()


def test_tls_failures_are_named_as_tls_failures(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    other, _ = self_signed_certificate(tmp_path, name="other")
    args = [*DIGITS, "--tls-cert", str(cert), "--tls-key", str(key)]
    with VictimProcess(args, token=TOKEN) as victim:
        with VictimClient(victim.address, tls_ca=cert.read_bytes(), token=TOKEN) as client:
            client.wait_ready(timeout=15)
            assert client.describe().token_accepted  # TLS works with the right certificate
        with VictimClient(victim.address) as plain:
            with pytest.raises(VictimError, match="speaks TLS.*--tls-ca"):
                plain.wait_ready(timeout=2)
        with VictimClient(victim.address, tls_ca=other.read_bytes()) as wrong:
            with pytest.raises(VictimError, match="TLS: the victim's certificate .* not "
                                                  "verified"):
                wrong.wait_ready(timeout=2)
    with VictimProcess(DIGITS, token=TOKEN) as plaintext, \
            VictimClient(plaintext.address, tls_ca=cert.read_bytes()) as client:
        with pytest.raises(VictimError, match="does not speak TLS"):
            client.wait_ready(timeout=2)
    with pytest.raises(ValueError, match="not HOST:PORT"):
        VictimClient("localhost")
    _, other_key = self_signed_certificate(tmp_path, name="other")
    mismatched = subprocess.run([sys.executable, "-m", "fedleak", "victim", "serve", *DIGITS,
                                 "--port", "0", "--tls-cert", str(cert), "--tls-key",
                                 str(other_key)], capture_output=True, text=True, timeout=1200)
    assert mismatched.returncode != 0
    assert "TLS certificate and key do not match" in mismatched.stderr
    assert "in use" not in mismatched.stderr and "Traceback" not in mismatched.stderr


def test_secagg_refuses_a_minority_threshold_unless_allowed() -> None:
    args = ["--dataset", "digits", "--split", "all", "--images", "0-15", "--model",
            "mlp:width=16,depth=1", "--users", "4"]
    with pytest.raises(VictimProcessError, match="not a majority"):
        VictimProcess([*args, "--defense", "secagg:threshold=2"], start_timeout=600).start()
    with VictimProcess([*args, "--defense", "secagg:threshold=2,allow-minority=true"]) as victim:
        warning = "WARNING: secure aggregation with threshold 2 of 4"
        waited = time.monotonic() + 300  # stderr is read by its own thread: it may lag stdout
        while warning not in victim.stderr_tail() and time.monotonic() < waited:
            time.sleep(0.1)
        assert warning in victim.stderr_tail()


def test_a_burst_of_sigterms_stops_an_idle_victim() -> None:
    """The stop handler takes no lock: a handler that did could deadlock with the main
    thread it interrupted (which waited on the same lock), and the victim ignored SIGTERM."""
    for _ in range(3):
        victim = VictimProcess(DIGITS).start()
        assert victim._proc is not None
        for _ in range(30):
            if victim._proc.poll() is not None:
                break
            os.kill(victim.pid, signal.SIGTERM)
            time.sleep(0.005)
        assert victim._proc.wait(timeout=300) == 0


def test_victims_do_not_import_code_planted_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep or demo started from a folder holding ``click.py`` (imported by every fedleak
    command) must not run it in the victims it starts."""
    planted = tmp_path / "planted-ran"
    (tmp_path / "click.py").write_text(f"open({str(planted)!r}, 'w').write('ran')\n"
                                       "raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", os.environ.get("PYTHONPATH", "")]))
    with VictimProcess(DIGITS) as victim, VictimClient(victim.address, timeout=60) as client:
        assert client.describe().num_private_images == 4
    assert not planted.exists()
