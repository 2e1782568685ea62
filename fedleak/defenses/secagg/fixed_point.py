r"""Fixed-point quantisation of float updates into the ring :math:`\mathbb{Z}_{2^{32}}`.

Secure aggregation adds masks modulo :math:`R = 2^{32}`, so a float update must first become
integers that can be summed over :math:`K` users without wrapping around.

For a clipping range :math:`[-c, c]` and at most :math:`K` users, every coordinate is mapped to
one of :math:`L + 1` levels

.. math::

    L = \left\lfloor \frac{R - 1}{K} \right\rfloor, \qquad s = \frac{L}{2c}, \qquad
    q(x) = \operatorname{round}\big((\operatorname{clip}(x, -c, c) + c)\, s\big) \in [0, L].

The floor makes the no-wrap guarantee exact: a sum of :math:`k \le K` quantised vectors is at
most :math:`K L \le R - 1`, so the sum computed modulo :math:`R` equals the sum over the
integers. Dequantising a sum of :math:`k` vectors removes the :math:`k` offsets:

.. math::

    \widehat{\textstyle\sum_u x_u} = \frac{\sum_u q(x_u)}{s} - k c .

Each :math:`q` is off by at most half a level, so per coordinate

.. math::

    \Big| \widehat{\textstyle\sum_u x_u} - \textstyle\sum_u \operatorname{clip}(x_u) \Big|
    \le \frac{k}{2s} = \frac{k c}{L} \approx \frac{k K c}{2^{32}},

(widened by a relative :math:`2^{-16}` in :meth:`FixedPointQuantizer.error_bound` to cover
float64 rounding). With :math:`K = 8`, :math:`c = 1`: :math:`1.5 \cdot 10^{-8}` per coordinate
for the full sum. Values outside :math:`[-c, c]` are clipped first; that error is not bounded
here (it is the clipping defense's job to pick :math:`c`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MODULUS = 2**32
"""The ring size :math:`R`: masked vectors are ``numpy.uint32`` and wrap around modulo it."""


@dataclass(frozen=True)
class FixedPointQuantizer:
    """Maps floats in ``[-clip, clip]`` to ``uint32`` so that ``max_users`` of them sum exactly.

    Parameters
    ----------
    clip
        the clipping bound :math:`c > 0`.
    max_users
        the most vectors :math:`K` that will ever be summed (the number of users).
    """

    clip: float
    max_users: int

    def __post_init__(self) -> None:
        """Refuse a clip that is not positive and finite, and a user count outside [1, R)."""
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite number, got {self.clip!r}")
        if not 1 <= self.max_users < MODULUS:
            raise ValueError(f"max_users must be in [1, 2^32), got {self.max_users!r}")

    @property
    def levels(self) -> int:
        r""":math:`L = \lfloor (2^{32} - 1) / K \rfloor`, the largest quantised value."""
        return (MODULUS - 1) // self.max_users

    @property
    def scale(self) -> float:
        """:math:`s = L / (2c)`, levels per unit."""
        return self.levels / (2.0 * self.clip)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        r""":math:`q(x) = \operatorname{round}((\operatorname{clip}(x) + c)\,s)` as ``uint32``.

        Raises
        ------
        ValueError
            ``x`` holds NaN or infinity.
        """
        values = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError("cannot quantise a vector with NaN or infinite values")
        clipped = np.clip(values, -self.clip, self.clip)
        levels = np.rint((clipped + self.clip) * self.scale)
        return np.clip(levels, 0, self.levels).astype(np.uint32)

    def dequantize_sum(self, total: np.ndarray, count: int) -> np.ndarray:
        r"""Float64 estimate :math:`\sum_u q(x_u) / s - k c` of the sum of ``count`` inputs.

        Parameters
        ----------
        total
            the ``uint32`` sum (mod :math:`2^{32}`) of ``count`` quantised vectors.
        count
            :math:`k`, how many vectors were summed, ``1 <= count <= max_users``.
        """
        if not 1 <= count <= self.max_users:
            raise ValueError(f"count must be in [1, {self.max_users}], got {count}")
        total = np.asarray(total)
        if total.dtype != np.uint32:
            raise ValueError(f"expected a uint32 sum, got dtype {total.dtype}")
        return total.astype(np.float64) / self.scale - count * self.clip

    def error_bound(self, count: int) -> float:
        """Largest per-coordinate error of :meth:`dequantize_sum` on clipped inputs.

        :math:`k / (2s)`, widened by a relative :math:`2^{-16}` for float64 rounding.
        """
        return count * (1.0 + 2.0**-16) / (2.0 * self.scale)
