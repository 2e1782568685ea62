"""The picture of an audit: the score histograms of canary-in and canary-out trials, the
decision threshold, and every estimator's ε beside the accountant's claimed ε."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedleak.auditing import AuditBound, format_epsilon  # noqa: E402
from fedleak.auditing.result import format_confidence  # noqa: E402


class AuditFigures(Protocol):
    """What the picture needs of an audit record (``attacker.audit.AuditRecord`` has it)."""

    victim: dict[str, Any]
    canary: dict[str, Any]
    claim: dict[str, Any]
    trials: int
    bounds: list[AuditBound]
    violation: bool
    histogram: dict[str, list[float]]

    @property
    def claimed_epsilon(self) -> float: ...

    def bound(self, estimator: str) -> AuditBound | None: ...


def score_density(counts: list[float], widths: np.ndarray) -> np.ndarray:
    """Counts per bin as a density, n_b / (N · w_b): the victim's bins hold equal counts and
    differ in width, so raw counts would draw the tails as plateaus; the area is 1."""
    values = np.asarray(counts, dtype=float)
    total = values.sum()
    return values / (total * widths) if total > 0 else values


def bar_label(bound: AuditBound) -> str:
    """An ε bar's label: the estimator, its group where it has one, estimate or bound."""
    group = f" · {bound.group}" if bound.group else ""
    return f"{bound.estimator}{group}" + (" (estimate)" if bound.is_estimate else "")


def plot_audit(record: AuditFigures, path: Path) -> Path:
    """Left: the two score histograms and the threshold; right: ε per estimator against the
    claimed ε (a bar above the line is a violation)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    edges = np.asarray(record.histogram["edges"], dtype=float)
    if edges.size >= 2:
        widths = np.diff(edges)
        for counts, label, color in ((record.histogram["canary_out"], "canary out", "C0"),
                                     (record.histogram["canary_in"], "canary in", "C3")):
            left.bar(edges[:-1], score_density(counts, widths), width=widths, align="edge",
                     alpha=0.55, color=color, label=f"{label} ({int(sum(counts))} trials)")
    else:
        left.text(0.5, 0.5, "no score histogram: the victim shows one only over bins of at "
                  "least 100 trials\n(fewer would give its secret coins away)",
                  transform=left.transAxes, ha="center", va="center", fontsize=8)
    bound = record.bound("gaussian-dp") or next(iter(record.bounds), None)
    if bound is not None and bound.threshold is not None and math.isfinite(bound.threshold):
        left.axvline(bound.threshold, color="black", linestyle="--",
                     label=f"threshold ({bound.estimator})")
    left.set_xlabel("score: sign · ⟨received update, canary direction⟩")
    left.set_ylabel("density: trials / (all trials · bin width)")
    left.legend(fontsize=8)
    left.set_title(f"{record.canary['text']}", fontsize=9)

    names = [bar_label(b) for b in record.bounds]
    values = [b.epsilon if math.isfinite(b.epsilon) else np.nan for b in record.bounds]
    colors = ["0.6" if b.is_estimate else ("C3" if b.epsilon > record.claimed_epsilon
                                          else "C2") for b in record.bounds]
    positions = np.arange(len(names))
    right.barh(positions, values, color=colors)
    for y, b in zip(positions, record.bounds, strict=True):
        confidence = "" if b.confidence is None else f" ({format_confidence(b.confidence)})"
        right.text(0, y, f" {format_epsilon(b.epsilon)}{confidence}", va="center", fontsize=8)
    claimed = record.claimed_epsilon
    if math.isfinite(claimed):
        right.axvline(claimed, color="black", linestyle="--",
                      label=f"claimed ε {format_epsilon(claimed)} ({record.claim['accountant']})")
        right.legend(fontsize=8, loc="lower right")
    else:
        right.text(0.98, 0.02, "claimed ε = ∞ (no DP claim)", transform=right.transAxes,
                   ha="right", fontsize=8)
    right.set_yticks(positions, names, fontsize=8)
    right.set_xlabel(f"ε at δ = {record.claim['delta']:g}")
    right.set_title("ε lower bounds beside the accountant's ε", fontsize=9)
    verdict = "VIOLATION" if record.violation else "no violation"
    fig.suptitle(f"audit of {', '.join(record.victim['defenses']) or 'no defense'}: "
                 f"{record.trials} trials — {verdict}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
