"""The server's side of the audit game: run the trials, score each one, submit the scores.

The attacker never chooses or learns the coins. It opens an audit at the global model
(``BeginAudit``: the victim builds the public canary and flips the coins), receives every
trial's defended update — in batches (``RunAuditTrials``), or as the unmasked sum of one
secure-aggregation round per trial (``BeginSecAgg`` with the audit id) — and scores it with the
canary's test statistic (Nasr et al. 2023's gradient-canary statistic)

    s_i = sign · ⟨Δ_i, u⟩,

u the canary's public unit direction (an input canary's: its normalised gradient at θ) and
sign the orientation the victim publishes (a FedAvg delta moves against a gradient), so a
larger score means "the canary was in". It submits the scores once (``SubmitAuditScores``)
and gets the victim's bounds, the chain's claimed ε for one trial and whether a bound exceeds
it. :class:`AuditRecord` writes ``audit.json``; :mod:`~fedleak.harness.attacker.games.audit_picture`
draws the score histograms.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedleak.auditing import AuditBound, DeclarationTest, format_epsilon
from fedleak.auditing.audit_defaults import (
    DEFAULT_CALIBRATION,
    DEFAULT_CONFIDENCE,
    DEFAULT_FALSE_ALARM,
    DEFAULT_POWER,
    DEFAULT_SHORTFALL,
    DEFAULT_THRESHOLD_RULE,
)
from fedleak.auditing.result import format_confidence
from fedleak.defenses.secagg import SecAggAbort
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.described import defense_specs
from fedleak.harness.attacker.secagg_rounds import run_secagg
from fedleak.harness.wire.codec import decode_tensor
from fedleak.harness.wire.protocol_spec import protocol_from_pb
from fedleak.v1 import victim_pb2 as pb

AUDIT_JSON = "audit.json"
AUDIT_PICTURE = "audit.png"


@dataclass(frozen=True)
class AuditSettings:
    """What to audit and how (0 / empty: the victim's default)."""

    canary: str = "gradient"
    direction: str = ""
    seed: int = 0
    norm: float = 0.0
    coordinate: int | None = None
    #: 0: as many as catch noise ``detect_shortfall``·σ with ``power`` (the victim chooses)
    trials: int = 0
    delta: float = 0.0
    confidence: float = DEFAULT_CONFIDENCE
    threshold_rule: str = DEFAULT_THRESHOLD_RULE
    threshold: float = 0.0
    calibration_fraction: float = DEFAULT_CALIBRATION
    detect_shortfall: float = DEFAULT_SHORTFALL
    power: float = DEFAULT_POWER
    false_alarm: float = DEFAULT_FALSE_ALARM
    #: canaries over every parameter tensor and the clip geometry (False: the primary alone)
    coverage: bool = True
    max_chosen_trials: int = 0
    #: trials asked for per RunAuditTrials call (the victim may send fewer)
    batch: int = 256
    show_progress: bool = True

    def request(self) -> pb.BeginAuditRequest:
        request = pb.BeginAuditRequest(
            canary=self.canary, direction=self.direction, canary_seed=self.seed,
            canary_norm=self.norm, trials=self.trials, delta=self.delta,
            confidence=self.confidence, threshold_rule=self.threshold_rule,
            threshold=self.threshold, calibration_fraction=self.calibration_fraction,
            detect_shortfall=self.detect_shortfall, power=self.power,
            false_alarm=self.false_alarm, single_canary=not self.coverage,
            max_chosen_trials=self.max_chosen_trials)
        if self.coordinate is not None:
            request.coordinate = self.coordinate
        return request


@dataclass
class AuditRecord:
    """One audit as the server saw it: settings, canary, claim, bounds, verdict, timing."""

    victim: dict[str, Any]
    settings: dict[str, Any]
    audit_id: str
    canary: dict[str, Any]
    threat_model: str
    claim: dict[str, Any]
    trials: int
    bounds: list[AuditBound]
    violation: bool
    verdict: str
    histogram: dict[str, list[float]]
    trial_seconds: float
    wall_time_s: float
    aborted_rounds: int = 0
    files: dict[str, str] = field(default_factory=dict)
    tests: list[DeclarationTest] = field(default_factory=list)
    power_statement: str = ""
    detectable_noise: float | None = None
    false_alarm: float = 0.0
    coverage: str = ""

    @property
    def claimed_epsilon(self) -> float:
        return float(self.claim["epsilon"])

    def bound(self, estimator: str) -> AuditBound | None:
        return next((b for b in self.bounds if b.estimator == estimator), None)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["bounds"] = [b.to_json() for b in self.bounds]
        data["tests"] = [t.to_json() for t in self.tests]
        return data

    def write(self, out: Path) -> Path:
        """``out/audit.json``, written atomically."""
        out.mkdir(parents=True, exist_ok=True)
        path = out / AUDIT_JSON
        scratch = path.with_suffix(".json.tmp")
        scratch.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True))
        scratch.replace(path)
        return path

    def summary_lines(self) -> list[str]:
        """What a person reads: the bounds beside the claim, the tests of every group, the
        one-shot estimate apart with its interval, the verdict with its power."""
        claim = self.claim
        reported = claim.get("reported_epsilon")
        also = f"; its accountant reports ε {format_epsilon(reported)}" if reported else ""
        lines = [f"audit {self.audit_id[:16]}: {self.trials} trials of the {self.canary['text']}",
                 f"threat model: {self.threat_model}",
                 f"coverage: {self.coverage or 'the primary canary alone'}",
                 f"claimed: ε {format_epsilon(claim['epsilon'])} at δ = {claim['delta']:g} "
                 f"({claim['accountant']}; {claim['mechanism']}{also})"]
        lines += bounds_table([b for b in self.bounds if not b.is_estimate])
        rule = next((b.threshold_rule for b in self.bounds if not b.is_estimate
                     and b.threshold is not None), "")
        if rule:
            lines.append(f"threshold: {rule}")
        lines += tests_table(self.tests, self.false_alarm)
        for t in self.tests:
            if t.ratio is None and t.test not in ("clopper-pearson", "gaussian-dp", "one-run",
                                                  "subsampled-gaussian"):
                lines.append(f"  {t.test} ({t.group}): {t.statement} (p = {t.p_value:.2g})"
                             + ("  VIOLATION" if t.rejected else ""))
        for b in self.bounds:
            if b.is_estimate:
                interval = "" if b.interval_low is None else \
                    (f" [{format_epsilon(b.interval_low)}, {format_epsilon(b.interval_high)}] "
                     f"({b.interval_level or 0:.0%} interval)")
                lines.append(f"{b.estimator} estimate (not a bound): ε ≈ "
                             f"{format_epsilon(b.epsilon)}{interval}; {b.note}")
        if self.aborted_rounds:
            lines.append(f"{self.aborted_rounds} secure-aggregation round(s) aborted "
                         "(scored 0)")
        lines.append(self.verdict)
        lines.append(f"{self.trials} trials in {self.trial_seconds:.1f} s "
                     f"({self.wall_time_s:.1f} s in all)")
        return lines


def tests_table(tests: list[DeclarationTest], false_alarm: float) -> list[str]:
    """The tests of the declaration as rows: the noise as a factor f of the declared std (the
    noise-ratio test: as if the noise were f× — 1/r), its upper bound, p, and the factor each
    would have caught with its power."""
    rows = [t for t in tests if t.ratio is not None]
    if not rows:
        return []
    out = [f"tests of the declared mechanism (f = 1: as declared; false-alarm rate "
           f"{false_alarm:g} over {len(tests)} tests, Holm):",
           f"  {'test':<16} {'group':<26} {'f':>7} {'f ≤':>7} {'p':>9}  {'catches':>8}"]
    for t in sorted(rows, key=lambda t: (t.p_value, t.test)):
        mark = "  VIOLATION" if t.rejected else ""
        catches = "–" if not t.detectable_noise else f"<{t.detectable_noise:.3f}"
        out.append(f"  {t.test:<16} {t.group[:26]:<26} {_number(_flip(t.ratio)):>7} "
                   f"{_number(_flip(t.ratio_lower)):>7} {t.p_value:>9.2g}  {catches:>8}{mark}")
    return out


def _flip(value: float | None) -> float | None:
    if value is None:
        return None
    return 0.0 if math.isinf(value) else math.inf if value == 0 else 1 / value


def bounds_table(bounds: list[AuditBound]) -> list[str]:
    """The bounds as rows (estimates never appear here); per-group bounds by their worst."""
    header = f"  {'estimator':<22} {'ε_LB':>8}  {'conf.':>8}  {'in/out':>13}"
    rows = [header]
    grouped = [b for b in bounds if b.group]
    for b in [b for b in bounds if not b.group]:
        rows.append(f"  {b.estimator:<22} {format_epsilon(b.epsilon):>8}  "
                    f"{format_confidence(b.confidence or 0):>8}  "
                    f"{b.trials_in:>6}/{b.trials_out:<6}")
    if grouped:
        worst = max(grouped, key=lambda b: b.epsilon)
        name = f"{worst.estimator} (worst)"
        rows.append(f"  {name:<22} {format_epsilon(worst.epsilon):>8}  "
                    f"{format_confidence(worst.confidence or 0):>8}  "
                    f"{worst.trials_in:>6}/{worst.trials_out:<6}  {worst.group}")
    return rows


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _flat(tensors: list[torch.Tensor]) -> np.ndarray:
    return torch.cat([t.detach().double().flatten() for t in tensors]).numpy()


def run_audit(client: VictimClient, settings: AuditSettings, out: Path | None = None,
              log: Callable[[str], Any] = print) -> AuditRecord:
    """Play the audit game against the victim behind ``client``; write ``out/audit.json``
    (and ``out/audit.png``) when ``out`` is given."""
    from tqdm import tqdm

    started = time.perf_counter()
    described = client.describe()
    if not described.audit_enabled:
        raise VictimError(_failed_precondition(),
                          f"the victim at {client.address} does not play the audit game: "
                          "start it with --allow-audit")
    params, buffers = client.global_model()
    begin = client.begin_audit(params, buffers, settings.request())
    direction = _flat([decode_tensor(t, "canary direction") for t in begin.canary_direction])
    sign = begin.score_sign or 1.0
    log(f"audit {begin.audit_id[:16]} opened: {begin.trials} trials, {begin.threat_model}")
    scores: list[float] = []
    aborted = 0
    bar = tqdm(total=begin.trials, desc="audit trials", unit="trial", leave=False,
               dynamic_ncols=True, disable=not settings.show_progress)
    trials_started = time.perf_counter()
    try:
        if begin.secure_aggregation:
            protocol = protocol_from_pb(begin.protocol)
            for _ in range(begin.trials):
                try:
                    aggregation = run_secagg(client, params, buffers, protocol,
                                                         begin.audit_id)
                    scores.append(sign * float(aggregation.result.total @ direction))
                except SecAggAbort:
                    aborted += 1
                    scores.append(0.0)
                bar.update(1)
        else:
            left = begin.trials
            while left > 0:
                reply = client.run_audit_trials(begin.audit_id, min(settings.batch, left))
                if not reply.trials:
                    break
                for trial in reply.trials:
                    if trial.index != len(scores):
                        raise VictimError(_failed_precondition(),
                                          f"trial {trial.index} arrived out of order")
                    update = _flat([decode_tensor(t, "update") for t in trial.update])
                    scores.append(sign * float(update @ direction))
                bar.update(len(reply.trials))
                left = reply.trials_left
    finally:
        bar.close()
    trial_seconds = time.perf_counter() - trials_started
    report = client.submit_audit_scores(begin.audit_id, scores)
    record = _record(client, described, settings, begin, report, trial_seconds,
                     time.perf_counter() - started, aborted)
    if out is not None:
        from fedleak.harness.attacker.games.audit_picture import plot_audit

        record.files["picture"] = plot_audit(record, out / AUDIT_PICTURE).name
        record.files["json"] = AUDIT_JSON
        record.write(out)
    return record


def _failed_precondition() -> Any:
    import grpc

    return grpc.StatusCode.FAILED_PRECONDITION


def bounds_from_report(report: pb.AuditReport) -> list[AuditBound]:
    """The report's bounds as :class:`~fedleak.auditing.AuditBound` (NaN fields → None)."""

    def value(x: float) -> float | None:
        return None if math.isnan(x) else x

    return [AuditBound(
        estimator=b.estimator, epsilon=b.epsilon, is_estimate=b.is_estimate,
        confidence=None if b.is_estimate else b.confidence, trials_in=b.trials_in,
        trials_out=b.trials_out, delta=b.delta, canary=b.canary, threat_model=b.threat_model,
        threshold_rule=b.threshold_rule, threshold=value(b.threshold),
        lower_threshold=value(b.lower_threshold), fpr_upper=value(b.fpr_upper),
        fnr_upper=value(b.fnr_upper), mu=value(b.mu), group=b.group,
        interval_low=value(b.interval_low), interval_high=value(b.interval_high),
        interval_level=value(b.interval_level), note=b.note) for b in report.bounds]


def tests_from_report(report: pb.AuditReport) -> list[DeclarationTest]:
    """The report's tests of the declaration (NaN fields → None)."""

    def value(x: float) -> float | None:
        return None if math.isnan(x) else x

    return [DeclarationTest(
        test=t.test, group=t.group, p_value=t.p_value, rejected=t.rejected,
        statement=t.statement, samples_in=t.samples_in, samples_out=t.samples_out,
        ratio=value(t.ratio), ratio_lower=value(t.ratio_lower),
        detectable_noise=value(t.detectable_noise), power=value(t.power),
        epsilon_lb=value(t.epsilon_lb), level=value(t.level)) for t in report.tests]


def _record(client: VictimClient, described: pb.DescribeResponse, settings: AuditSettings,
            begin: pb.BeginAuditResponse, report: pb.AuditReport, trial_seconds: float,
            wall: float, aborted: int) -> AuditRecord:
    canary = {"kind": begin.canary, "direction": begin.direction, "norm": begin.canary_norm,
              "coordinate": begin.coordinate if begin.direction == "dirac" else None,
              "label": begin.canary_label if begin.canary == "input" else None,
              "seed": settings.seed, "score_sign": begin.score_sign,
              "expected_shift": begin.expected_shift, "text": report.canary}
    claim = {"epsilon": report.claim.epsilon, "delta": report.claim.delta,
             "mechanism": report.claim.mechanism, "accountant": report.claim.accountant,
             "mu": report.claim.mu or None,
             "reported_epsilon": report.claim.reported_epsilon or None}
    victim = {"address": client.address, "model": described.model.name,
              "model_options": dict(described.model.options),
              "dataset": described.data.dataset, "defenses": defense_specs(described),
              "protocol": begin.update_kind, "users": described.num_users,
              "images_per_round": described.protocol.num_images}
    asked = dataclasses.asdict(settings)
    asked.pop("show_progress")
    histogram = {"edges": list(report.histogram.edges),
                 "canary_in": [float(c) for c in report.histogram.canary_in],
                 "canary_out": [float(c) for c in report.histogram.canary_out]}
    return AuditRecord(victim=victim, settings=asked, audit_id=report.audit_id, canary=canary,
                       threat_model=report.threat_model, claim=claim, trials=report.trials,
                       bounds=bounds_from_report(report), violation=report.violation,
                       verdict=report.verdict, histogram=histogram,
                       trial_seconds=trial_seconds, wall_time_s=wall, aborted_rounds=aborted,
                       tests=tests_from_report(report), power_statement=report.power_statement,
                       detectable_noise=None if math.isnan(report.detectable_noise)
                       else report.detectable_noise, false_alarm=report.false_alarm,
                       coverage=report.coverage)
