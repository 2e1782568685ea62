"""The bounds chart: per DP point, ε from both sides and reconstruction success from both sides.

For every defense setting with a DP mechanism (a ``dpsgd`` point), one column of three panels,
each bound named with what it covers — **one attacked step** (the round the attack saw), **one
audit trial**, or **the whole deployment** (every round of the utility training) — and δ in
the title:

- privacy loss: the accountant's ε of the whole deployment (▼, an *upper* bound on its privacy
  loss) and, where an audit ran, the audited ε_LB of one audit trial (▲, a *lower* bound:
  canaries measured it) beside the accountant's ε for that trial (▽: the claim the bound is
  tested against). The axis is linear near 0 (symlog), so an ε_LB of 0 shows, and is labelled;
- reconstruction success at η dB: the DP bound β(κ) of one attacked step (▼, an *upper* bound
  on every attack's success, at the public prior's κ(η)) and the strongest attack's measured
  success with its 95 % Clopper–Pearson interval (●, a *lower* bound on what an attack can
  do), the blind guess κ as a dash; under each column, the power of the check: how many of its
  n images would have to succeed for the success to exceed the bound beyond its interval (or
  that no count can, at that n);
- PSNR: the attack's mean PSNR (●), the victim's Fisher ceiling (▼, an upper bound for
  *unbiased* reconstructions only, Guo et al. 2022) and, to read it against, the public prior's
  mean image (–, a biased guess that reads nothing of the update): an attack with a prior
  (biased) above the ceiling is no violation; the grey guess shows by how much a biased
  estimate can clear it.

Each column is labelled with the attacked step's mechanism, the attack, and the deployment's
ε and test accuracy. A portfolio's attacks of one setting share a column: the strongest
(highest success, then PSNR) is shown. Text is laid out by
:mod:`~fedleak.harness.metrics.chart_layout`.
"""

from __future__ import annotations

import csv
import textwrap
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedleak.auditing.game_statistics import success_rate as interval  # noqa: E402
from fedleak.harness.metrics.chart_layout import keep_span, wrapped  # noqa: E402
from fedleak.harness.sweep.results import PointResult, format_epsilon  # noqa: E402


@dataclass
class BoundsRow:
    """One DP setting: its claims, its bounds and the strongest attack's measurements."""

    label: str
    setting: str
    attack: str
    epsilon: float | None
    delta: float | None
    epsilon_lb: float | None
    #: the accountant's ε for one audit trial (the claim ε_LB is compared with), or None
    epsilon_trial: float | None
    accuracy: float | None
    noise_multiplier: float
    sample_rate: float | None
    dp_steps: int | None
    success_psnr: float | None
    success_rate: float | None
    successes: int | None
    images: int
    kappa: float | None
    bound: float | None
    bound_se: float | None
    psnr: float | None
    fisher_ceiling: float | None
    #: the public prior's mean image's PSNR (a biased baseline), or None
    prior_psnr: float | None = None
    #: rounds of the deployment the accountant's ε covers (the utility training), or None
    deployment_rounds: int | None = None


def bounds_rows(results: list[PointResult],
                audited: Mapping[str, float] | None = None) -> list[BoundsRow]:
    """One row per DP setting (points sharing a utility measurement), strongest attack first;
    ``audited`` maps a point id to its audited ε_LB (issue 27's audit; optional)."""
    audited = audited or {}
    settings: OrderedDict[str, list[PointResult]] = OrderedDict()
    for r in results:
        if r.measured_attack is not None and r.measured_attack.noise_multiplier is not None:
            key = r.point.point_id if r.point.victim else r.point.utility_id
            settings.setdefault(key, []).append(r)
    rows = []
    for members in settings.values():
        best = max(members, key=lambda r: (r.attack.success_rate or 0.0,  # type: ignore[union-attr]
                                           r.psnr if r.psnr is not None else -1e9))
        a = best.attack
        assert a is not None and a.noise_multiplier is not None
        lb = next((audited[m.point_id] for m in members if m.point_id in audited), None)
        trial = next((m.audit.epsilon_claimed for m in members
                      if m.audit is not None and m.audit.epsilon_claimed is not None), None)
        kind = best.point.protocol.kind if best.point.protocol else ""
        rows.append(BoundsRow(
            label=best.label, setting=f"{best.setting}", attack=best.point.attack
            + (f" ({kind})" if kind else ""), epsilon=best.epsilon, delta=best.delta,
            epsilon_lb=lb, epsilon_trial=trial, accuracy=best.accuracy,
            noise_multiplier=a.noise_multiplier,
            sample_rate=a.sample_rate, dp_steps=a.dp_steps, success_psnr=a.success_psnr,
            success_rate=a.success_rate, successes=a.successes, images=a.images,
            kappa=a.kappa, bound=a.reconstruction_bound, bound_se=a.reconstruction_bound_se,
            psnr=best.psnr, fisher_ceiling=a.fisher_psnr_ceiling, prior_psnr=a.prior_psnr,
            deployment_rounds=best.utility.rounds if best.utility else None))
    return sorted(rows, key=lambda r: (r.epsilon is None, r.epsilon or 0.0))


def failing_count(images: int, bound: float | None) -> int | None:
    """The fewest successes of ``images`` whose 95 % interval lies wholly above ``bound`` (the
    check's power: None when no count can, e.g. 3 images against a bound of 0.3)."""
    if bound is None or images <= 0:
        return None
    for k in range(images + 1):
        if interval(k, images).low > bound:
            return k
    return None


def plot_bounds(rows: list[BoundsRow], path: Path, title: str = "") -> Path:
    """The three panels over the DP settings, sorted by ε (module doc)."""
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 1.9 * len(rows) + 2.5), 11.5),
                             sharex=True, layout="constrained")
    xs = np.arange(len(rows))
    eps_ax, success_ax, psnr_ax = axes
    deltas = {r.delta for r in rows if r.delta is not None}
    delta = f"δ = {deltas.pop():g}" if len(deltas) == 1 else "δ as accounted per column"

    def series(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], dtype=float)

    _privacy_panel(eps_ax, rows, xs, series, delta)
    _success_panel(success_ax, rows, xs, series)
    _psnr_panel(psnr_ax, rows, xs, series)
    per_column = 0.7 * fig.get_figwidth() * 72 / max(1, len(rows))
    width = max(12, int(per_column / (0.6 * 7)))
    psnr_ax.set_xticks(xs, ["\n".join(textwrap.fill(line, width) for line in
                                      _tick(r).split("\n")) for r in rows], fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if not rows:
        success_ax.text(0.5, 0.5, "no DP points", ha="center", transform=success_ax.transAxes)
    heading = (f"DP points from both sides ({delta})" + (f": {title}" if title else "")
               + "\n▼ upper bounds · ▲ ● lower bounds (measured) · the DP bound β covers one "
               "attacked step, the accountant's ε the whole deployment, ε_LB one audit trial")
    fig.suptitle(wrapped(heading, fig, 10), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _privacy_panel(ax: Any, rows: list[BoundsRow], xs: np.ndarray,
                   series: Any, delta: str) -> None:
    eps = series([r.epsilon for r in rows])
    ax.plot(xs, eps, "v", color="C3", markersize=10,
            label=wrapped("accountant ε of the whole deployment: upper bound on its privacy "
                          "loss", ax.figure, 7, 0.22))
    lbs = series([r.epsilon_lb for r in rows])
    if np.isfinite(lbs).any():
        ax.plot(xs, lbs, "^", color="C2", markersize=10,
                label=wrapped("audited ε_LB of one audit trial: lower bound on its privacy "
                              "loss", ax.figure, 7, 0.22))
        for x, value in zip(xs, lbs, strict=True):
            if value == 0:
                ax.annotate("ε_LB = 0", (x, 0), textcoords="offset points", xytext=(8, -3),
                            fontsize=7, color="C2")
    trials = series([r.epsilon_trial for r in rows])
    if np.isfinite(trials).any():
        ax.plot(xs, trials, "v", markerfacecolor="none", markeredgecolor="C2", markersize=10,
                label=wrapped("accountant ε of one audit trial (what ε_LB tests)", ax.figure,
                              7, 0.22))
        ax.vlines(xs, lbs, trials, color="C2", linewidth=1, alpha=0.6)
    ax.set_yscale("symlog", linthresh=0.1, linscale=0.5)
    top = np.nanmax(np.concatenate([eps, lbs, trials, [1.0]]))
    ax.set_ylim(-0.02, top * 3)
    ax.axhspan(0.5, 10, color="C2", alpha=0.06, label="ε 0.5–10: where deployments sit")
    ax.set_ylabel(f"ε at {delta}\n(symlog: linear below 0.1)")


def _success_panel(ax: Any, rows: list[BoundsRow], xs: np.ndarray, series: Any) -> None:
    bound = series([r.bound for r in rows])
    se = series([r.bound_se or 0.0 for r in rows])
    ax.errorbar(xs, bound, yerr=2 * se, fmt="v", color="C3", markersize=10, capsize=4,
                label=wrapped("DP bound β(κ) of one attacked step: no attack succeeds more "
                              "often (upper bound)", ax.figure, 7, 0.22))
    rates = series([r.success_rate for r in rows])
    intervals = [interval(r.successes or 0, r.images) if r.successes is not None and r.images
                 else None for r in rows]
    low = [0.0 if i is None else max(0.0, (r.success_rate or 0) - i.low)
           for r, i in zip(rows, intervals, strict=True)]
    high = [0.0 if i is None else max(0.0, i.high - (r.success_rate or 0))
            for r, i in zip(rows, intervals, strict=True)]
    ax.errorbar(xs, rates, yerr=[low, high], fmt="o", color="C0", markersize=9, capsize=4,
                label=wrapped("strongest attack's success, 95 % interval (lower bound on what "
                              "is possible)", ax.figure, 7, 0.22))
    ax.plot(xs, series([r.kappa for r in rows]), "_", color="gray", markersize=18,
            markeredgewidth=2, label="blind guess κ(η) of the public prior")
    for x, r in zip(xs, rows, strict=True):
        needed = failing_count(r.images, r.bound)
        power = (f"exceeds β only if\n≥ {needed} of {r.images} succeed" if needed is not None
                 else f"{r.images} images:\ncannot exceed β" if r.bound is not None else "")
        ax.annotate(power, (x, 1.12), ha="center", va="center", fontsize=7, color="dimgray")
    thresholds = {r.success_psnr for r in rows if r.success_psnr is not None}
    eta = f"{thresholds.pop():g} dB" if len(thresholds) == 1 else "η"
    ax.set_ylabel(f"success: images ≥ {eta}")
    ax.set_ylim(-0.03, 1.22)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def _psnr_panel(ax: Any, rows: list[BoundsRow], xs: np.ndarray, series: Any) -> None:
    psnr = series([r.psnr for r in rows])
    ax.plot(xs, psnr, "o", color="C0", markersize=9,
            label=wrapped("strongest attack's mean PSNR (lower bound on what is possible; "
                          "the attack's image prior makes it biased)", ax.figure, 7, 0.22))
    ceilings = series([r.fisher_ceiling for r in rows])
    ax.plot(xs, ceilings, "v", color="C4", markersize=10,
            label=wrapped("Fisher ceiling: no unbiased reconstruction above (Guo et al. "
                          "2022); biased ones may be, no violation", ax.figure, 7, 0.22))
    baseline = series([r.prior_psnr for r in rows])
    if np.isfinite(baseline).any():
        ax.plot(xs, baseline, "_", color="gray", markersize=22, markeredgewidth=2,
                label=wrapped("the public prior's mean image: a biased guess that reads "
                              "nothing of the update", ax.figure, 7, 0.22))
    ax.set_ylabel("PSNR (dB)")
    keep_span(ax, 6.0, [*psnr, *ceilings, *baseline])


def _tick(r: BoundsRow) -> str:
    q = f", q={r.sample_rate:.2g}" if r.sample_rate not in (None, 1.0) else ""
    acc = "–" if r.accuracy is None else f"{r.accuracy:.0%}"
    steps = "1 step" if r.dp_steps in (None, 1) else f"{r.dp_steps} steps"
    rounds = f", {r.deployment_rounds} rounds" if r.deployment_rounds else ""
    return (f"attacked: σ={r.noise_multiplier:g}{q}, {steps}\n{r.attack}\n"
            f"deployment: ε={format_epsilon(r.epsilon)}{rounds}\nacc {acc}")


def write_bounds_csv(rows: list[BoundsRow], path: Path) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(BoundsRow.__dataclass_fields__))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    return path
