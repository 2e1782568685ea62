"""The audit game across real processes: coins and canaries stay in the victim, this test plays
the server; a correct mechanism's ε_LB stays below its claimed ε, a broken plug-in behind the
proto is caught, and bad requests get clear errors while the victim keeps serving."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.games.audit_trials import AuditSettings, run_audit
from fedleak.harness.victim.audit.claim import trial_claim
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.victim.audit.sessions import MAX_CANARY_FREE, MIN_CANARY_FREE
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings, create_victim, defense_chain
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.v1 import victim_pb2 as pb
from tests.paths import REPO

pytestmark = pytest.mark.integration
ROOT = REPO
MODEL = "mlp:width=16,depth=1"
DPSGD = "dpsgd:noise-multiplier=1,max-grad-norm=1"
SCORE_TOKEN = "audit-score-token"


def _settings(*defenses: str, users: int = 1, budget: int = 16) -> VictimSettings:
    from fedleak.harness.victim.limits import VictimLimits

    return VictimSettings(dataset="digits", model=MODEL, split="all", images="0-31",
                          batch_size=4, defenses=defenses, defense_seed=7, users=users,
                          audit=True, limits=VictimLimits(audit_budget=budget,
                                                          max_audit_trials=5000))


@pytest.fixture(scope="module")
def dpsgd_victim() -> Iterator[VictimProcess]:
    with VictimProcess(_settings(DPSGD, budget=3),
                       env={"FEDLEAK_SCORE_TOKEN": SCORE_TOKEN}) as process:
        yield process


def test_dpsgd_bounds_stay_below_the_accountants_epsilon(dpsgd_victim: VictimProcess,
                                                         tmp_path: Path) -> None:
    with VictimClient(dpsgd_victim.address, score_token=SCORE_TOKEN) as client:
        described = client.describe()
        assert described.audit_enabled and described.audits_left == 3
        record = run_audit(client, AuditSettings(trials=500, threshold_rule="half-shift",
                                                 seed=3, show_progress=False),
                           tmp_path, log=lambda _: None)
    claim = record.claim
    assert claim["delta"] == 1e-5
    assert claim["epsilon"] == pytest.approx(4.3772, abs=1e-3)  # exact: σ = 1, q = 1, 1 step
    assert claim["reported_epsilon"] == pytest.approx(4.7285, abs=1e-3)  # its RDP accountant
    assert claim["accountant"] == "gaussian-dp (exact)"
    assert not record.violation and record.trials == 500
    bounds = {b.estimator: b for b in record.bounds if not b.group}
    assert set(bounds) == {"clopper-pearson", "gaussian-dp", "one-run", "one-shot"}
    groups = {b.group for b in record.bounds if b.estimator == "gaussian-scores"}
    assert "layers.1.bias" in groups and "spread (all tensors)" in groups  # every tensor
    assert "would have caught noise below" in record.verdict  # its power, stated
    for bound in bounds.values():
        assert bound.canary.startswith("gradient canary, dirac")
        assert "whole defended update" in bound.threat_model
        if not bound.is_estimate:
            assert 0 <= bound.epsilon <= claim["epsilon"] and bound.confidence == 0.95
            # the canary-free phase comes out of the 500 releases and is not scored
            free = min(MAX_CANARY_FREE, max(MIN_CANARY_FREE, 500 // 16))
            assert bound.trials_in + bound.trials_out == 500 - free
    assert bounds["gaussian-dp"].epsilon > 1.5  # the canary is seen: the GDP route is tight
    assert bounds["one-shot"].is_estimate
    written = json.loads((tmp_path / "audit.json").read_text())
    assert written["bounds"][1]["estimator"] == "gaussian-dp" and written["violation"] is False
    assert (tmp_path / "audit.png").stat().st_size > 10_000
    assert sum(written["histogram"]["canary_in"]) + sum(written["histogram"]["canary_out"]) \
        == 500 - free  # the scored releases


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(VictimError) as err:
        call()
    return err.value.code


def test_bad_requests_are_refused_and_coins_stay_inside(dpsgd_victim: VictimProcess) -> None:
    with VictimClient(dpsgd_victim.address, score_token=SCORE_TOKEN) as client:
        params, buffers = client.global_model()

        def begin(**kw: object) -> pb.BeginAuditResponse:
            return client.begin_audit(params, buffers, pb.BeginAuditRequest(**kw))

        for bad, text in [({"trials": 10**6}, "trials must lie in 1..5000"),
                          ({"trials": 10, "canary": "fuzz"}, "canary 'fuzz' is unknown"),
                          ({"trials": 10, "canary": "client"}, "extra user of a secure-agg"),
                          ({"trials": 10, "threshold_rule": "best"}, "threshold_rule 'best'"),
                          ({"trials": 10, "false_alarm": 0.7}, "false_alarm must lie"),
                          ({"detect_shortfall": 1.5}, "detect_shortfall must lie"),
                          ({"trials": 10, "coordinate": 10**9}, "coordinate must lie")]:
            with pytest.raises(VictimError) as err:
                begin(**bad)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and text in \
                err.value.details
        first, again = begin(trials=20, canary_seed=5), begin(trials=20, canary_seed=5)
        public = [f.name for f in pb.BeginAuditResponse.DESCRIPTOR.fields]
        assert not any("coin" in name for name in public)
        for name in ("canary_direction", "coordinate", "claim", "threshold", "expected_shift"):
            assert getattr(first, name) == getattr(again, name)  # nothing depends on the coins
        assert _code(lambda: client.run_audit_trials("nope", 5)) == grpc.StatusCode.NOT_FOUND
        assert _code(lambda: client.run_audit_trials(first.audit_id, 0)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert _code(lambda: client.submit_audit_scores(first.audit_id, [])) == \
            grpc.StatusCode.FAILED_PRECONDITION  # no trial has run
        reply = client.run_audit_trials(first.audit_id, 500)
        assert len(reply.trials) == 20 and reply.trials_left == 0
        assert [t.index for t in reply.trials] == list(range(20))
        assert _code(lambda: client.run_audit_trials(first.audit_id, 1)) == \
            grpc.StatusCode.FAILED_PRECONDITION  # every trial ran once
        assert _code(lambda: client.submit_audit_scores(first.audit_id, [0.0] * 19)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert _code(lambda: client.submit_audit_scores(first.audit_id, [math.nan] * 20)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        with VictimClient(dpsgd_victim.address) as tokenless:
            assert _code(lambda: tokenless.submit_audit_scores(first.audit_id, [0.0] * 20)) \
                == grpc.StatusCode.UNAUTHENTICATED
        report = client.submit_audit_scores(first.audit_id, [0.0] * 20)
        assert report.trials == 20 and not report.violation
        assert not report.histogram.edges  # 20 trials: no histogram (it would show coins)
        assert _code(lambda: client.submit_audit_scores(first.audit_id, [0.0] * 20)) == \
            grpc.StatusCode.FAILED_PRECONDITION  # final
        while client.describe().audits_left > 0:  # spend the rest of the budget (3)
            extra = begin(trials=4, threshold_rule="declared", threshold=0.5)
            client.run_audit_trials(extra.audit_id, 4)
            client.submit_audit_scores(extra.audit_id, [1.0] * 4)
        assert "--audit-budget" in client_error(lambda: begin(trials=10))
        assert client.describe().audit_enabled  # still serving


def client_error(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(VictimError) as err:
        call()
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    return err.value.details


def test_a_victim_without_allow_audit_refuses_in_process() -> None:
    victim = create_victim(VictimSettings(dataset="digits", model=MODEL, split="all",
                                          images="0-7", batch_size=4))
    params, buffers = victim.global_model()
    with pytest.raises(FailedPrecondition, match="--allow-audit"):
        victim.begin_audit(params, buffers, None, AuditRequest(trials=10))


def test_the_chain_claims_what_its_mechanisms_say() -> None:
    from fedleak.harness.federated.protocol import Protocol

    def claim(*specs: str, canary: str = "gradient", users: int = 1) -> float:
        chain = defense_chain(VictimSettings(defenses=specs))
        return trial_claim(chain, canary, 1.0, Protocol(), 8, users, 1e-5).epsilon

    assert claim("noise:sigma=1") == pytest.approx(4.3772, abs=1e-3)
    assert claim("clip:max-norm=0.25", "noise:sigma=1") == pytest.approx(1.993, abs=1e-3)
    assert claim("noise:sigma=1", "prune:p=0.5") == pytest.approx(4.3772, abs=1e-3)  # post
    assert math.isinf(claim("prune:p=0.5", "noise:sigma=1"))  # unbounded before the noise
    assert math.isinf(claim("clip:max-norm=1"))  # no noise, no claim
    assert math.isinf(claim("noise:sigma=1", canary="input"))  # one image: unbounded
    assert claim("clip:max-norm=1", "noise:sigma=1", canary="input") == \
        pytest.approx(claim("noise:sigma=0.5"), rel=1e-9)  # replaced within the ball: 2S
    assert claim("client-dp:noise-multiplier=1", "secagg", canary="client", users=4) == \
        pytest.approx(claim("noise:sigma=2"), rel=1e-9)  # four users' noise in the sum


def test_a_canary_client_among_secagg_users(tmp_path: Path) -> None:
    chain = ("client-dp:variant=distributed,clip-norm=1,noise-multiplier=0.5",
             "secagg:clip=8")
    with VictimProcess(_settings(*chain, users=3)) as process, \
            VictimClient(process.address) as client:
        record = run_audit(client, AuditSettings(canary="client", trials=40, batch=8,
                                                 threshold_rule="half-shift",
                                                 show_progress=False), None, lambda _: None)
    assert record.victim["users"] == 3 and "secure-aggregation sum of 3 users" in \
        record.threat_model
    assert record.claim["mu"] == pytest.approx(1 / (0.5 * math.sqrt(4 / 3)), rel=1e-6)
    assert any(t.test == "noise-level" for t in record.tests)  # the sum's noise, checked
    assert not record.violation
    assert all(b.epsilon <= record.claimed_epsilon for b in record.bounds if not b.is_estimate)


def test_fedleak_audit_catches_a_broken_plugin_behind_the_proto(tmp_path: Path) -> None:
    """claims σ = 1, adds σ = 0.5: ε_LB above the claimed 4.38, named a violation."""
    plugin = str(ROOT / "examples" / "dishonest_defense")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [plugin, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    service = VictimProcess(["--defense", "dishonest-gaussian:sigma=1"], env=env,
                            command=[sys.executable, "-m", "fedleak", "defense", "serve"]).start()
    try:
        out = tmp_path / "audit"
        done = subprocess.run(
            [sys.executable, "-m", "fedleak", "audit", "--defense",
             f"remote:address={service.address}", "--trials", "600", "--defense-seed", "1",
             "--threshold", "half-shift", "--out", str(out), "--quiet", "--fail-on-violation"],
            capture_output=True, text=True, timeout=1200, env=env)
    finally:
        service.stop()
    assert done.returncode == 3, done.stderr[-2000:]
    assert "VIOLATION: " in done.stdout and "claimed ε 4.38" in done.stdout
    record = json.loads((out / "audit.json").read_text())
    assert record["violation"] and record["claim"]["epsilon"] == pytest.approx(4.377, abs=1e-3)
    noise = next(t for t in record["tests"] if t["test"] == "noise-level"
                 and t["group"] == "all tensors pooled")
    assert noise["rejected"] and 1 / noise["ratio"] == pytest.approx(0.5, abs=0.05)  # σ/2
    assert "remote" in record["victim"]["defenses"][0]
    gdp = next(b for b in record["bounds"] if b["estimator"] == "gaussian-dp")
    assert gdp["epsilon"] > 4.377


def test_a_third_party_dpsgd_behind_the_proto_gets_dpsgds_claim(tmp_path: Path) -> None:
    """private-sgd (tests/test_plugin_package: plain torch, not dpsgd's class) served by
    `fedleak defense serve` and linked as a per-example remote: the same claim as dpsgd, no
    violation, every tensor covered."""
    plugin = str(ROOT / "tests" / "test_plugin_package")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [plugin, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    service = VictimProcess(["--defense", "private-sgd:noise-multiplier=1"], env=env,
                            command=[sys.executable, "-m", "fedleak", "defense", "serve"]).start()
    try:
        out = tmp_path / "audit"
        done = subprocess.run(
            [sys.executable, "-m", "fedleak", "audit", "--defense",
             f"remote:address={service.address},stage=per-example", "--images", "0-7",
             "--model", "mlp:width=16", "--trials", "120", "--defense-seed", "1", "--out",
             str(out), "--quiet", "--fail-on-violation"],
            capture_output=True, text=True, timeout=300, env=env)
    finally:
        service.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((out / "audit.json").read_text())
    assert record["claim"]["epsilon"] == pytest.approx(4.3772, abs=1e-3)  # dpsgd's, exactly
    assert record["claim"]["reported_epsilon"] == pytest.approx(4.7285, abs=1e-3)
    assert not record["violation"] and "would have caught noise below" in record["verdict"]
    assert {t["group"] for t in record["tests"]} >= {"layers.1.bias", "layers.5.weight"}
