"""Fig. 4 of Haim et al. (2022): SSIM of every training sample against its margin y_i Φ(θ; x_i).

The KKT attack recovers the samples that lie on the margin (y_i Φ(θ; x_i) close to the
smallest margin, λ_i > 0 in eq. (2)); samples far from it have λ_i = 0 and leave no trace in θ.
The plot shows one dot per training sample, the recovery threshold (SSIM 0.4) and, when given,
a control level (e.g. the mean SSIM of held-out samples the model never saw).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch import Tensor  # noqa: E402


def plot_ssim_vs_margin(
    path: Path,
    margins: Tensor,
    ssims: Tensor,
    *,
    threshold: float = 0.4,
    control: float | None = None,
    title: str = "",
) -> Path:
    """Scatter SSIM (y) against the margin y_i Φ(θ; x_i) (x, log scale when all positive)."""
    margins = margins.detach().double().cpu()
    ssims = ssims.detach().double().cpu()
    figure, ax = plt.subplots(figsize=(5, 4))
    recovered = ssims >= threshold
    ax.scatter(margins[~recovered], ssims[~recovered], s=14, c="tab:blue", label="not recovered")
    ax.scatter(margins[recovered], ssims[recovered], s=14, c="tab:red",
               label=f"recovered (SSIM ≥ {threshold:g})")
    ax.axhline(threshold, color="r", ls=":", lw=1)
    if control is not None:
        ax.axhline(control, color="0.5", ls="--", lw=1, label="control (held-out mean)")
    if len(margins) and bool((margins > 0).all()):
        ax.set_xscale("log")
    ax.set_xlabel("margin y_i Φ(θ; x_i)")
    ax.set_ylabel("SSIM of the reconstruction")
    ax.set_title(title or f"{int(recovered.sum())}/{len(ssims)} recovered", fontsize=9)
    ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
