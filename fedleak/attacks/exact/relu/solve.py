"""The solve for a ReLU layer's inputs once every direction is certified.

Dimitrov et al., "SPEAR", NeurIPS 2024, eq. 3–5; the maths in
:mod:`~fedleak.attacks.exact.relu.sparsity`: ``X = (K diag(s))⁻¹ R`` with the scales from
``K s = β``, and SPEAR's check that every recovered input's ReLU pattern agrees with its
direction's zero set.
"""

from __future__ import annotations

import numpy as np

from fedleak.attacks.exact.relu.direction_search import DirectionSet
from fedleak.attacks.exact.relu.sparsity import FactoredGradient, ReluSparsityError


def solve_inputs(grad: FactoredGradient, columns: np.ndarray) -> np.ndarray:
    """Solve for the inputs ``X = Q⁻¹ R`` [n, d] from n columns of Q of any scale.

    The scales ``s`` come from ``K s = β`` (least squares), then ``X = (K diag(s))⁻¹ R``.

    Raises
    ------
    ReluSparsityError
        When ``columns`` is not n × n.
    """
    if columns.shape != (grad.rank, grad.rank):
        raise ReluSparsityError(f"need {grad.rank} directions, got {columns.shape[1]}")
    scales = np.linalg.lstsq(columns, grad.totals, rcond=None)[0]
    return np.linalg.solve(columns * scales[None, :], grad.right)


def solve_checked(grad: FactoredGradient, found: DirectionSet,
                  layer: tuple[np.ndarray, np.ndarray], agree: float = 0.99
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """Solve with the n directions found, then check every input's ReLU pattern.

    Each pattern is checked against its direction's zero set (:func:`activation_agreement`).
    When some disagree (agreement under ``agree``), a direction was a mixture that passed the
    tests: those are dropped from ``found`` and None is returned (search on); otherwise the
    inputs and their agreements.
    """
    columns = found.columns()
    inputs = solve_inputs(grad, columns)
    agreement = activation_agreement(inputs, layer[0], layer[1], grad, columns)
    bad = np.flatnonzero(agreement < agree)
    if bad.size:
        found.found = [d for i, d in enumerate(found.found) if i not in set(bad.tolist())]
        return None
    return inputs, agreement


def activation_agreement(inputs: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                         grad: FactoredGradient, columns: np.ndarray) -> np.ndarray:
    """Return, per recovered input, the fraction of live units where its ReLU pattern agrees.

    The ReLU the forward pass gives (``x Wᵀ + b > 0``) against the output gradient's support
    (``L q ≠ 0``): 1.0 for an exact recovery (SPEAR's consistency check).
    """
    forward = inputs @ np.asarray(weight, dtype=np.float64).T + np.asarray(bias, np.float64)
    agree = np.zeros(inputs.shape[0])
    live = grad.live
    for j in range(inputs.shape[0]):
        active = ~grad.zero_set(columns[:, j])
        agree[j] = float(np.mean((forward[j] > 0)[live] == active[live]))
    return agree
