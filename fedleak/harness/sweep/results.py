"""A sweep's store read back as one flat result per point, and the summary table of them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedleak.harness.sweep.grid.architecture import user_model
from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    AuditMeasurement,
    UtilityMeasurement,
)
from fedleak.harness.sweep.store import STORE_NAME, ResultStore


@dataclass
class PointResult:
    """A point with its status and whatever of its measurements the store holds."""

    point: Point
    status: str
    error: str | None
    attack: AttackMeasurement | None
    utility: UtilityMeasurement | None
    audit: AuditMeasurement | None = None

    @property
    def point_id(self) -> str:
        return self.point.point_id

    @property
    def label(self) -> str:
        measured = self.attack or self.utility
        if not self.point.victim or not measured:
            return self.point.label
        chain = measured.defenses or ["no defense"]
        return f"{self.point.victim}: {' + '.join(chain)}"

    @property
    def group(self) -> str:
        """The curve this point belongs to: the swept defense, or what a user's victim ran."""
        if not self.point.victim:
            return self.point.group
        measured = self.attack or self.utility
        chain = measured.defenses if measured else []
        return " + ".join(d.split(":", 1)[0] for d in chain) or "none"

    @property
    def reference(self) -> bool:
        if self.point.victim:
            return self.group == "none"
        return self.point.reference

    @property
    def context(self) -> str:
        """Everything but the defense: points of one context share a chart."""
        return f"{self.point.attack} {self.setting}" if self.point.victim else \
            f"{self.point.attack} · {self.setting}"

    @property
    def setting(self) -> str:
        """Everything but the defense and the attack: the attacks of a portfolio at one
        defense setting share it (:mod:`fedleak.harness.sweep.worst_case`). A server-designed
        architecture around the user's model (imprint) belongs to the attack, not the setting."""
        p = self.point
        if p.victim:
            return "vs victims"
        trained = ("trained" if p.trained is True else "untrained" if p.trained is False
                   else f"checkpoint {Path(str(p.trained)).name}")
        kind = p.protocol.kind if p.protocol else "?"
        return f"{user_model(p.model)} · {p.dataset} · {kind} · {trained}"

    @property
    def truncated(self) -> bool:
        """Whether a safety time limit cut some attacked round: then the point's attack is not
        a measurement and its figures below are None."""
        return bool(self.attack and self.attack.truncated)

    @property
    def measured_attack(self) -> AttackMeasurement | None:
        """The attack measurement when it is one (None when absent or truncated)."""
        return None if self.truncated else self.attack

    @property
    def psnr(self) -> float | None:
        return self.measured_attack.mean_psnr if self.measured_attack else None

    @property
    def ssim(self) -> float | None:
        return self.measured_attack.mean_ssim if self.measured_attack else None

    @property
    def label_accuracy(self) -> float | None:
        return self.measured_attack.label_accuracy if self.measured_attack else None

    @property
    def floor_psnr(self) -> float | None:
        """The attacked images' trivial floor (best constant guess), mean PSNR."""
        return self.measured_attack.floor_psnr if self.measured_attack else None

    @property
    def floor_ssim(self) -> float | None:
        return self.measured_attack.floor_ssim if self.measured_attack else None

    @property
    def shown_status(self) -> str:
        """The status a table shows: ``truncated`` beside it when the attack was cut."""
        return f"{self.status}, truncated" if self.truncated else self.status

    @property
    def accuracy(self) -> float | None:
        return self.utility.test_accuracy if self.utility else None

    @property
    def epsilon(self) -> float | None:
        """ε the defense claims: after utility training if measured, else after the attack."""
        for record in (self.utility, self.attack):
            if record and record.epsilon is not None:
                return float(record.epsilon)
        return None

    @property
    def epsilon_lb(self) -> float | None:
        """The largest audited ε lower bound (None without an audit)."""
        best = self.audit.best if self.audit else None
        return best[1] if best else None

    @property
    def delta(self) -> float | None:
        for record in (self.utility, self.attack):
            if record and record.delta is not None:
                return float(record.delta)
        return None

    def picture_files(self, kind: str = "comparison") -> list[str]:
        """Per attacked round, the comparison picture (else the reconstruction), run-relative."""
        if not self.attack:
            return []
        files = []
        for r in self.attack.rounds:
            path = r.files.get(kind) or r.files.get("reconstruction")
            if path and path.endswith(".png"):  # text rounds leave text (comparison.md)
                files.append(path)
        return files


def load_results(run_dir: Path) -> list[PointResult]:
    """Every point of the run folder's store, in spec order, with its measurements."""
    path = Path(run_dir) / STORE_NAME
    if not path.exists():
        raise FileNotFoundError(f"no sweep results at {path}; run `fedleak sweep` first")
    with ResultStore(path) as store:
        stored = store.points()
        measured: dict[tuple[str, str], dict[str, Any]] = {
            (m.point_id, m.kind): m.metrics for m in store.measurements()}
    results = []
    for s in stored:
        attack = measured.get((s.point.point_id, "attack"))
        utility = measured.get((s.point.point_id, "utility"))
        audit = measured.get((s.point.point_id, "audit"))
        results.append(PointResult(
            s.point, s.status, s.error,
            AttackMeasurement.from_json(attack) if attack is not None else None,
            UtilityMeasurement.from_json(utility) if utility is not None else None,
            AuditMeasurement.from_json(audit) if audit is not None else None))
    return results


def format_epsilon(epsilon: float | None) -> str:
    if epsilon is None:
        return "–"
    if math.isinf(epsilon):
        return "∞"
    return f"{epsilon:.3g}"


def format_audit(result: PointResult) -> str:
    """ε_LB (largest lower bound) for a table cell, with a mark when it exceeds the claim."""
    if result.audit is None or result.epsilon_lb is None:
        return "–"
    return f"{result.epsilon_lb:.3g}" + ("!" if result.audit.violation else "")


def summary_table(results: list[PointResult]) -> str:
    """A plain-text table: one line per point with PSNR beside its floor (the best constant
    guess's PSNR), SSIM, labels, accuracy, ε, the audited ε_LB (``!``: above the claimed ε, a
    violation), status."""
    text = bool(results) and all(r.attack is None or r.psnr is None for r in results) and any(
        r.attack is not None and (r.attack.rouge1 is not None or r.attack.token_recall
                                  is not None) for r in results)
    first, second, third = ("ROUGE-1", "ROUGE-2", "tokR") if text else \
        ("PSNR dB", "SSIM", "labels")
    header = (f"{'point':<16}  {'defense':<34}  {first:>7}  {'floor':>7}  {second:>7}  "
              f"{third:>6}  {'test acc':>8}  {'ε':>8}  {'ε_LB':>7}  status")
    lines = [header, "-" * len(header)]
    for r in results:
        psnr = "–" if r.psnr is None else f"{r.psnr:.2f}"
        floor = "–" if r.floor_psnr is None else f"{r.floor_psnr:.2f}"
        ssim = "–" if r.ssim is None else f"{r.ssim:.3f}"
        labels = "–" if r.label_accuracy is None else f"{r.label_accuracy:.0%}"
        if text:
            a = r.attack
            psnr, ssim, labels = ("–" if a is None or v is None else f"{v:.3f}" for v in (
                None if a is None else a.rouge1, None if a is None else a.rouge2,
                None if a is None else a.token_recall))
        acc = "–" if r.accuracy is None else f"{r.accuracy:.1%}"
        lines.append(f"{r.point_id:<16}  {r.label[:34]:<34}  {psnr:>7}  {floor:>7}  {ssim:>7}  "
                     f"{labels:>6}  {acc:>8}  {format_epsilon(r.epsilon):>8}  "
                     f"{format_audit(r):>7}  {r.shown_status}")
    if any(r.floor_psnr is not None for r in results):
        lines.append("floor: the mean PSNR of the best constant guess of each attacked image "
                     "(grey, the mean of the victim's other private images, its own mean "
                     "colour); a PSNR not above it recovered nothing beyond a constant guess")
    for r in results:
        if r.attack is not None and r.truncated:
            for reason in r.attack.truncated:
                lines.append(f"truncated {r.point_id} (not a measurement): {reason}")
    return "\n".join(lines)
