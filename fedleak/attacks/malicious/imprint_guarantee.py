"""What a binning attack should recover, in closed form, beside what it did.

k cut-offs split the measurement's range into k + 1 intervals; the lowest, (−∞, c_1], is read
by no row, so k intervals can hold a recoverable input, and an input is recovered exactly when
it is alone in one of them. Two closed forms for N inputs:

- **multinomial** (inputs drawn independently from the distribution the cut-offs were fitted
  to, so each interval has probability 1/(k+1)): an input lands in a readable interval with
  probability k/(k+1) and is alone there with probability (1 − 1/(k+1))^{N−1}, so

      E[exact] = N · k/(k+1) · (k/(k+1))^{N−1} = N · (k/(k+1))^N.

- **the paper's count** (Fowl et al. 2022, Sec. 3.2 and its appendix): every occupancy of the
  bins by N indistinguishable inputs equally likely (Bose–Einstein), C(N+k−1, k−1) of them, of
  which C(N+k−3, k−2) leave a given bin with exactly one input, so

      E[single bins] = k · C(N+k−3, k−2) / C(N+k−1, k−1) = k · (k−1) · N / ((N+k−1)(N+k−2)).

  This is the more pessimistic of the two (about 41 of 64 for k = 256) and the figure the paper
  quotes as its guarantee; the multinomial one (about 50 of 64) is what equal-mass bins give
  when the server's public data matches the users' distribution.

:func:`expected_trapped` is the same reasoning for trap weights (Boenisch et al. 2023): m rows,
each active for an input with probability p independently, and an input counted as recovered
when at least two rows are active for it alone (two agreeing rows confirm it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Expected:
    """Expected number of exactly recovered inputs under each closed form."""

    multinomial: float
    paper: float


def expected_single_bins(bins: int, inputs: int) -> Expected:
    """Return the expected exact recoveries for ``bins`` cut-offs and ``inputs`` inputs.

    With k = ``bins`` and N = ``inputs`` (module docstring): ``multinomial`` is
    ``N · (k/(k+1))^N``, ``paper`` the count of Fowl et al. 2022,
    ``k · (k−1) · N / ((N+k−1)(N+k−2))``, at most N. Both are 0 when k or N is under 1.
    """
    k, n = int(bins), int(inputs)
    if k < 1 or n < 1:
        return Expected(0.0, 0.0)
    multinomial = n * (k / (k + 1)) ** n
    paper = k * (k - 1) * n / ((n + k - 1) * (n + k - 2)) if n + k > 2 else 1.0
    return Expected(multinomial, min(paper, float(n)))


def expected_trapped(rows: int, inputs: int, rate: float) -> float:
    """Return the expected inputs with two or more rows active for them alone (Poisson).

    Row r isolates input i with probability q = p (1 − p)^{N−1}; the count of isolating rows of
    one input is about Poisson(λ = m q), and P(≥ 2) = 1 − e^{−λ}(1 + λ).
    """
    if rows < 1 or inputs < 1 or not 0 < rate < 1:
        return 0.0
    lam = rows * rate * (1 - rate) ** (inputs - 1)
    return inputs * (1 - math.exp(-lam) * (1 + lam))
