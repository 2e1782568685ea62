"""Trade-off curve of the Poisson-subsampled Gaussian, and a μ lower bound under it.

The trade-off curve of the Poisson-subsampled Gaussian mechanism, and a μ lower bound from a test's
error rates that respects it — the Gaussian-DP route for a mixture.

Under Poisson sampling at rate q a canary joins a step only with probability q, so what the
server sees with the canary in is the mixture (1 − q)·N(0, 1) + q·N(μ, 1) against N(0, 1) out
(one step, in units of the noise). Its trade-off curve (Dong, Roth & Su 2019, Theorem 4.2: the
subsampled mechanism is min{f_q, f_q⁻¹}**-DP) is

    f_q(α) = q · Φ(Φ⁻¹(1 − α) − μ) + (1 − q)(1 − α),     f = min{f_q, f_q⁻¹}**,

the lower convex envelope of the two. A test of "canary in" observed with FPR ≤ FPR_ub and
FNR ≤ FNR_ub (Clopper–Pearson upper bounds at α/2 each) refutes every μ whose curve lies above
the point, FNR_ub < f(FPR_ub) (f is symmetric, so this covers the swapped test too); μ_LB is the
largest refuted μ, and ε_LB the ε of the subsampled Gaussian at q with noise multiplier 1/μ_LB.
The Gaussian-DP route's curve G_μ assumes the canary is always present; for a mixture it
converts the same error rates into a far smaller μ, which is why Poisson audits used to look
weak. Sharp edge: like the Gaussian-DP route this assumes the declared family (one
Poisson-subsampled Gaussian step); it is the route for FedSGD's single step.
"""

from __future__ import annotations

import numpy as np

from fedleak.auditing.estimators.clopper_pearson import upper_bound

#: α grid of the curve: dense near 0, where the tests that matter live
_GRID = np.unique(np.concatenate([np.logspace(-12, 0, 1500), np.linspace(0, 1, 501)]))


def tradeoff(mu: float, q: float, alpha: np.ndarray) -> np.ndarray:
    """Return f at ``alpha``: the lower convex envelope of min{f_q, f_q⁻¹} (module docstring)."""
    from scipy.stats import norm

    a = _GRID
    f = q * norm.cdf(norm.isf(a) - mu) + (1 - q) * (1 - a)
    xs = np.concatenate([a, f, [0.0, 1.0]])
    ys = np.concatenate([f, a, [1.0, 0.0]])
    order = np.lexsort((ys, xs))
    hull = _lower_hull(xs[order], ys[order])
    return np.asarray(np.interp(alpha, hull[:, 0], hull[:, 1]), dtype=float)


def _lower_hull(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Andrew's monotone chain: the lower convex hull of points sorted by x."""
    hull: list[tuple[float, float]] = []
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append((x, y))
    return np.array(hull)


def refutes(mu: float, q: float, fpr: float, fnr: float) -> bool:
    """Whether a test with these (upper-bounded) rates is impossible under μ at rate q."""
    return bool(fnr < tradeoff(mu, q, np.array([fpr]))[0] - 1e-12)


def mu_lower_bound_subsampled(false_positives: int, negatives: int, false_negatives: int,
                              positives: int, alpha: float, q: float) -> float:
    """Return μ_LB of the Poisson-subsampled Gaussian at rate ``q`` from error counts.

    μ_LB of the Poisson-subsampled Gaussian at rate ``q`` from a test's error counts, both rates
    bounded at α/2 (0 when even μ → 0 is not refuted).
    """
    from scipy.optimize import brentq

    if not 0 < q <= 1:
        raise ValueError(f"the sample rate must lie in (0, 1], got {q}")
    fpr = upper_bound(false_positives, negatives, alpha / 2)
    fnr = upper_bound(false_negatives, positives, alpha / 2)
    if not refutes(1e-6, q, fpr, fnr):
        return 0.0
    high = 1.0
    while refutes(high, q, fpr, fnr):
        high *= 2
        if high > 64:
            return high
    return float(brentq(lambda m: 0.5 - float(refutes(m, q, fpr, fnr)), 1e-6, high,
                        xtol=1e-4))
