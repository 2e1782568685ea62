"""The bounds chart: per DP point, ε from both sides and reconstruction success from both sides.

For every defense setting with a DP mechanism (a ``dpsgd`` point), one column of three panels:

- privacy loss: the accountant's ε over the whole deployment (▼, an *upper* bound on the
  privacy loss, as true as the implementation) and, where an audit ran, the audited ε_LB (▲, a
  *lower* bound: canaries measured it) beside the accountant's ε for what one audit trial
  covers (▽: the claim the bound is tested against — one round, not the deployment);
- reconstruction success at η dB: the DP bound β(κ) (▼, an *upper* bound on every attack's
  success, at the public prior's κ(η)) and the strongest attack's measured success (●, a
  *lower* bound on what an attack can do), the blind guess κ as a dash;
- PSNR: the attack's mean PSNR (●) and the victim's Fisher ceiling (▼, an upper bound for
  *unbiased* reconstructions, Guo et al. 2022).

Each column is labelled with the setting, its ε and the test accuracy it kept. A portfolio's
attacks of one setting share a column: the strongest (highest success, then PSNR) is shown.
"""

from __future__ import annotations

import csv
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

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
            psnr=best.psnr, fisher_ceiling=a.fisher_psnr_ceiling))
    return sorted(rows, key=lambda r: (r.epsilon is None, r.epsilon or 0.0))


def plot_bounds(rows: list[BoundsRow], path: Path, title: str = "") -> Path:
    """The three panels over the DP settings, sorted by ε (module doc)."""
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 1.25 * len(rows) + 3), 9.5), sharex=True)
    xs = np.arange(len(rows))
    eps_ax, success_ax, psnr_ax = axes

    def series(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], dtype=float)

    eps = series([r.epsilon for r in rows])
    eps_ax.plot(xs, eps, "v", color="C3", markersize=10,
                label="accountant ε of the deployment: upper bound on its privacy loss")
    lbs = series([r.epsilon_lb for r in rows])
    if np.isfinite(lbs).any():
        eps_ax.plot(xs, lbs, "^", color="C2", markersize=10,
                    label="audited ε_LB of one trial: lower bound on its privacy loss")
    trials = series([r.epsilon_trial for r in rows])
    if np.isfinite(trials).any():
        eps_ax.plot(xs, trials, "v", markerfacecolor="none", markeredgecolor="C2",
                    markersize=10, label="accountant ε of one audited trial (what ε_LB tests)")
        eps_ax.vlines(xs, lbs, trials, color="C2", linewidth=1, alpha=0.6)
    eps_ax.set_yscale("log")
    eps_ax.set_ylabel("ε (δ as accounted)")
    eps_ax.axhspan(0.5, 10, color="C2", alpha=0.06, label="ε 0.5–10: where deployments sit")

    bound = series([r.bound for r in rows])
    se = series([r.bound_se or 0.0 for r in rows])
    success_ax.errorbar(xs, bound, yerr=2 * se, fmt="v", color="C3", markersize=10, capsize=4,
                        label="DP bound β(κ): no attack succeeds more often (upper bound)")
    success_ax.plot(xs, series([r.success_rate for r in rows]), "o", color="C0", markersize=9,
                    label="strongest attack's success (lower bound on what is possible)")
    success_ax.plot(xs, series([r.kappa for r in rows]), "_", color="gray", markersize=18,
                    markeredgewidth=2, label="blind guess κ(η) of the public prior")
    thresholds = {r.success_psnr for r in rows if r.success_psnr is not None}
    eta = f"{thresholds.pop():g} dB" if len(thresholds) == 1 else "η"
    success_ax.set_ylabel(f"success: images ≥ {eta}")
    success_ax.set_ylim(-0.03, 1.03)

    psnr_ax.plot(xs, series([r.psnr for r in rows]), "o", color="C0", markersize=9,
                 label="strongest attack's mean PSNR (lower bound on what is possible)")
    ceilings = series([r.fisher_ceiling for r in rows])
    psnr_ax.plot(xs, ceilings, "v", color="C4", markersize=10,
                 label="Fisher ceiling: no unbiased reconstruction above (Guo et al. 2022)")
    psnr_ax.set_ylabel("PSNR (dB)")
    psnr_ax.set_xticks(xs, [_tick(r) for r in rows], fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    if not rows:
        success_ax.text(0.5, 0.5, "no DP points", ha="center", transform=success_ax.transAxes)
    fig.suptitle("DP points from both sides" + (f": {title}" if title else "")
                 + "\n▼ upper bounds · ▲ ● lower bounds (measured)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tick(r: BoundsRow) -> str:
    q = f", q={r.sample_rate:.2g}" if r.sample_rate not in (None, 1.0) else ""
    acc = "–" if r.accuracy is None else f"{r.accuracy:.0%}"
    return (f"σ={r.noise_multiplier:g}{q}, T={r.dp_steps}\n{r.attack}\n"
            f"ε={format_epsilon(r.epsilon)}, acc {acc}")


def write_bounds_csv(rows: list[BoundsRow], path: Path) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(BoundsRow.__dataclass_fields__))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    return path
