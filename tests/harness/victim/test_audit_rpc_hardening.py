"""The audit RPCs against a hostile client: the answer gives no coin away whatever scores come
in, an audit is its opener's (no one else evicts it), errors quote no large input, and the
victim's lifetime cap on trials holds."""

from __future__ import annotations

import types
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from fedleak.auditing import GameSettings, calibration_split
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.audit.book import (
    IDLE_SECONDS,
    MAX_OPEN_AUDITS,
    MAX_OPEN_PER_OWNER,
    AuditBook,
)
from fedleak.harness.victim.audit.claim import TrialClaim
from fedleak.harness.victim.audit.histogram import MIN_TRIALS_PER_BIN, released_histogram
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.victim.audit.sessions import AuditSession, outcome
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings
from fedleak.harness.wire.request_errors import FailedPrecondition, NotFound, ResourceExhausted
from fedleak.v1 import victim_pb2 as pb

SCORE_TOKEN = "hardening-score-token"


# -- the answer reveals no coin -------------------------------------------------------------

def _answered(coins: np.ndarray, scores: np.ndarray, rule: str, threshold: float | None,
              rng: np.random.Generator):  # noqa: ANN202
    n = coins.size
    calibration = calibration_split(n, 0.2, rng) if rule == "split" else np.zeros(n, bool)
    request = AuditRequest(trials=n, delta=1e-5, confidence=0.95, threshold_rule=rule,
                           threshold=threshold or 0.0, calibration_fraction=0.2,
                           coverage=False).checked(max_trials=max(n, 4), secagg=False)
    session = types.SimpleNamespace(
        coins=coins, calibration=calibration, threshold=threshold, audit_id="a",
        claim=TrialClaim(epsilon=1.0, delta=1e-5, mechanism="gaussian", accountant="exact",
                         mu=0.2), request=request, coverage=None, threat_model="t",
        describe_canary=lambda: "c", settings=lambda: GameSettings(1e-5, 0.95, "c", "t"))
    return outcome(session, scores)  # type: ignore[arg-type]


def _guesses(report, scores: np.ndarray) -> dict[str, np.ndarray]:  # noqa: ANN001
    """What a client that scored trial i as i can read off the answer, as coin guesses."""
    hist = report.histogram
    if hist.edges:
        index = np.clip(np.searchsorted(hist.edges, scores, side="right") - 1, 0,
                        len(hist.canary_in) - 1)
        majority = np.array([hist.canary_in[i] >= hist.canary_out[i] for i in index])
    else:
        majority = np.ones(scores.size, dtype=bool)
    cut = next(b for b in report.bounds if b.estimator == "clopper-pearson")
    by_threshold = scores >= cut.threshold
    # a declared threshold above every score but the last one: its error rates would say
    # whether that trial's canary was in
    last = np.zeros(scores.size, dtype=bool)
    last[-1] = cut.fnr_upper is not None and cut.fnr_upper < 1
    return {"histogram": majority, "threshold": by_threshold, "error rates": last}


@pytest.mark.parametrize(("rule", "threshold"), [("split", None), ("declared", 38.5)])
def test_a_client_scoring_trials_by_index_learns_no_more_than_chance(
        rule: str, threshold: float | None) -> None:
    """The issue's attack: scores = the trial index in a 40-trial audit (it read 40 of 40
    coins off the old 40-bin histogram). Over 300 audits (12,000 coins) every guess read off
    the answer is right about half the time: within 4 standard errors (±1.8 %) of ½."""
    rng = np.random.default_rng(0)
    n, audits = 40, 300
    scores = np.arange(n, dtype=float)
    right: dict[str, int] = {}
    for _ in range(audits):
        coins = rng.random(n) < 0.5
        report = _answered(coins, scores, rule, threshold, rng)
        assert report.histogram.edges == [] and report.histogram.canary_in == []
        for name, guess in _guesses(report, scores).items():
            right[name] = right.get(name, 0) + int((guess == coins).sum())
    bound = 4 * 0.5 / np.sqrt(n * audits)
    for name, count in right.items():
        assert abs(count / (n * audits) - 0.5) < bound, (name, count / (n * audits))


def test_large_audits_show_histograms_of_bins_of_at_least_a_hundred_trials() -> None:
    rng = np.random.default_rng(1)
    for scores in (np.arange(1000.0), np.repeat(np.arange(10.0), 100), rng.normal(size=777),
                   np.concatenate([np.zeros(990), np.arange(10.0)])):
        coins = rng.random(scores.size) < 0.5
        hist = released_histogram(scores, coins)
        totals = [i + o for i, o in zip(hist.canary_in, hist.canary_out, strict=True)]
        assert sum(totals) in (0, scores.size)
        assert all(t >= MIN_TRIALS_PER_BIN for t in totals), totals
    wide = released_histogram(np.arange(1000.0), np.ones(1000, dtype=bool))
    assert len(wide.edges) == 11 and sum(wide.canary_in) == 1000
    assert released_histogram(np.arange(199.0), np.ones(199, dtype=bool)).edges == []


# -- open audits belong to their openers, trials are capped over the victim's life -------------

def _session(audit_id: str, trials: int = 10) -> AuditSession:
    return AuditSession(audit_id, AuditRequest(trials=trials), None, None,  # type: ignore[arg-type]
                        np.zeros(trials, dtype=bool), np.zeros(trials, dtype=bool), {}, {},
                        Protocol(), None, "", False, trials=trials)  # type: ignore[arg-type]


def test_a_client_without_the_token_cannot_evict_the_evaluators_audit() -> None:
    now = [0.0]
    book = AuditBook(budget=16, max_trials=100, clock=lambda: now[0])
    book.add(_session("evaluator-1"), "10.0.0.1", evaluator=True)
    for i in range(3 * MAX_OPEN_AUDITS):  # a griefer opens audit after audit
        book.add(_session(f"grief-{i}"), "10.0.0.66")
    assert book.get("evaluator-1").owner == "evaluator"
    with pytest.raises(NotFound):  # the griefer's cap evicted only its own oldest
        book.get("grief-0")
    for i in range(MAX_OPEN_AUDITS - 1 - MAX_OPEN_PER_OWNER):
        book.add(_session(f"other-{i}"), f"10.0.1.{i}")
    with pytest.raises(ResourceExhausted, match="audits are open"):  # full: no one evicted
        book.add(_session("late"), "10.0.2.9")
    assert book.get("other-0") and book.get(f"grief-{3 * MAX_OPEN_AUDITS - 1}")
    now[0] += IDLE_SECONDS + 1  # unused for ten minutes: a place for anyone, not the evaluator's
    book.get("evaluator-1")
    book.add(_session("late"), "10.0.2.9")
    book.add(_session("evaluator-2"), "10.0.3.3", evaluator=True)  # takes a client's place
    assert book.get("evaluator-1") and book.get("evaluator-2") and book.get("late")


def test_trials_are_capped_at_budget_times_max_trials_over_the_victims_life() -> None:
    book = AuditBook(budget=1, max_trials=100)
    run = 0
    for i in range(12):  # the issue ran 1,200 trials this way, never submitting
        session = _session(f"a-{i}", trials=100)
        try:
            book.check_open()
        except FailedPrecondition as err:
            assert "--audit-budget 1 × --max-audit-trials 100" in str(err)
            break
        book.add(session, "10.0.0.5")
        try:
            while session.left:
                run += len(book.reserve(session, 30))
        except FailedPrecondition:
            break
    assert run == book.trials_run == 100


# -- across processes ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def audited_victim() -> Iterator[VictimProcess]:
    from fedleak.harness.victim.limits import VictimLimits

    settings = VictimSettings(dataset="digits", model="mlp:width=16,depth=1", split="all",
                              images="0-31", batch_size=4, audit=True,
                              limits=VictimLimits(audit_budget=1, max_audit_trials=100))
    with VictimProcess(settings, env={"FEDLEAK_SCORE_TOKEN": SCORE_TOKEN}) as process:
        yield process


@pytest.mark.integration
def test_audit_rpcs_hold_against_a_client_without_the_token(
        audited_victim: VictimProcess) -> None:
    with VictimClient(audited_victim.address, score_token=SCORE_TOKEN) as evaluator, \
            VictimClient(audited_victim.address) as griefer:
        params, buffers = evaluator.global_model()
        mine = evaluator.begin_audit(params, buffers, pb.BeginAuditRequest(trials=60))
        huge = "x" * (1 << 20)
        with pytest.raises(VictimError) as err:
            griefer.begin_audit(params, buffers, pb.BeginAuditRequest(trials=10, canary=huge))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "is unknown" in err.value.details and len(err.value.details) < 1000
        theirs = [griefer.begin_audit(params, buffers, pb.BeginAuditRequest(trials=20))
                  for _ in range(2 * MAX_OPEN_AUDITS)]  # the eviction: 8 sufficed
        assert len(evaluator.run_audit_trials(mine.audit_id, 60).trials) == 60
        assert len(griefer.run_audit_trials(theirs[-1].audit_id, 20).trials) == 20
        assert len(griefer.run_audit_trials(theirs[-2].audit_id, 20).trials) == 20
        with pytest.raises(VictimError) as err:  # 100 trials run: the 1 × 100 lifetime cap
            griefer.run_audit_trials(theirs[-3].audit_id, 20)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "--audit-budget 1 × --max-audit-trials 100" in err.value.details
        report = evaluator.submit_audit_scores(mine.audit_id, [float(i) for i in range(60)])
        assert report.trials == 60 and not report.histogram.edges
        assert griefer.describe().audit_enabled  # still serving
