"""Scores at report precision: what a report needs, never the exact floats.

PSNR to 0.01 dB, SSIM and cosines to 1e-4, MSE and relative errors to three significant
figures, a release's margins y_i Φ(θ; x_i) to five (Fig. 4 plots them on a log scale).
Rounding alone is no defence — finite differences with larger steps still read a private image
from rounded MSEs (docs/security.md measures it) — the score budget is; rounding only keeps a
budget-sized handful of answers from carrying more than a report shows.
"""

from __future__ import annotations

import math


def psnr(value: float) -> float:
    """PSNR in dB to 0.01 dB (infinity stays infinity)."""
    return value if math.isinf(value) else round(float(value), 2)


def unit(value: float) -> float:
    """SSIM, cosine or any value on about [-1, 1] to 1e-4."""
    return round(float(value), 4)


def significant(value: float, digits: int = 3) -> float:
    """``value`` to ``digits`` significant figures (MSE, relative error, margin)."""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")
