"""The informed-adversary game's picture: measured success beside what DP permits."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedleak.harness.metrics.chart_layout import wrapped  # noqa: E402


def plot_game(path: Path, title: str, *, rate: float, low: float, high: float, trials: int,
              kappa: float, bound: float | None, bound_error: float = 0.0) -> Path:
    """One panel: the attack's success rate with its interval (a lower bound on what an attack
    can do), the DP bound β(κ) (an upper bound on every attack) and the blind guess κ."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    ax.errorbar([0], [rate], yerr=[[rate - low], [high - rate]], fmt="o", color="C0",
                capsize=6, markersize=9,
                label=f"prior-aware attack, {trials} trials (95% CI): at least this is possible")
    if bound is not None:
        ax.errorbar([1], [bound], yerr=[[2 * bound_error], [2 * bound_error]], fmt="v",
                    color="C3", capsize=6, markersize=11,
                    label="DP bound β(κ) = 1 − f(κ): no attack succeeds more often")
    ax.axhline(kappa, color="gray", linestyle="--", label=f"blind guess κ = 1/N = {kappa:.3g}")
    ax.set_xticks([0, 1], ["measured success", "DP bound"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("probability of guessing the target")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(wrapped(title + "\n(β covers the mechanism of one trial, from its trade-off "
                         "curve: no ε or δ enters)", fig, 9), fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
