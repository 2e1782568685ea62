"""Exact inputs of a linear layer followed by ReLU, from the sparsity of its output gradient.

Dimitrov et al., "SPEAR: Exact Gradient Inversion of Batches in Federated Learning", NeurIPS
2024, Sec. 3–4: the maths that :mod:`~fedleak.attacks.exact.spear` and
:mod:`~fedleak.attacks.exact.cocktail_party.cpa` share.

**The factorisation.** A linear layer ``Z = X Wᵀ + b`` (``W`` of shape [m, d]) on a batch of n
inputs ``X`` [n, d] has, for any loss, the gradients

    G := ∂L/∂W = Dᵀ X,        g := ∂L/∂b = Dᵀ 1,        D := ∂L/∂Z  [n, m],

so ``G`` has rank n (when n ≤ m, n ≤ d and the inputs are independent). A truncated SVD gives
``G = L R`` with ``L`` [m, n] and ``R`` [n, d] (``L = U S^p``, ``R = S^{1−p} Vᵀ``: SPEAR's
``p = ½``; cocktail-party's search uses ``p = 0``, below), and because ``Dᵀ`` spans the same
columns as ``L`` there is an invertible ``Q`` [n, n] with

    Dᵀ = L Q,        X = Q⁻¹ R,        Q 1 = L⁺ g =: β.                        (SPEAR eq. 3–5)

Column j of ``Q`` gives input j's output gradient ``L q_j``. **When a ReLU follows the layer**,
that gradient is exactly zero at every unit inactive for input j — about half of them — so
``q_j`` is the one direction (up to scale) that ``L``'s rows at those units all annihilate:
``L_Z q_j = 0`` for ``Z = {k : z_{jk} ≤ 0}``. Any n − 1 of those rows determine it (their null
space); a sum of several columns vanishes only where all of them do, so it has far fewer zeros.

**Certifying a direction.** A candidate ``q`` (the null vector of some n − 1 rows) is accepted
when its zero set ``Z(q)`` — the entries of ``L q`` below a gap of at least a decade under the
rest (float32 updates leave zeros near 1e-7 of the largest entry, not 0) — holds at least n − 1
+ ``margin`` *distinct* rows (rows equal up to scale, from units active for the same inputs
only, count once: any null vector of n − 1 rows is also orthogonal to their copies) and ``L_Z``
has a one-dimensional null space (its smallest singular value well under the next one; a
mixture of t columns has a t-dimensional one). ``q`` is first refined to the null vector of its
whole zero set, which averages the float32 noise over hundreds of rows.

**The metric of the search.** Every certified direction is the same vector of ``col(L)``
whatever ``p``, but a search near an estimate (null vectors of rows chosen by ``|L q|``) measures
distances in ``q``'s coordinates. With ``p = 0`` (``L`` orthonormal), ``Q = Uᵀ Dᵀ`` is as well
conditioned as the output gradients ``D``; with ``p = ½`` it mixes in the inputs' singular
values, and near-duplicate images (a condition number in the thousands) squeeze the basin of
every direction: measured on 64 faces 96–159 (4 × 16 sum, MLP 512), a start 0.3 away (relative,
in ``δ``) refines to its input for 56 of 64 at ``p = 0`` and 11 at ``p = ½``.

**The classifier's form (a second certificate).** When the ReLU feeds the classifier directly
(``z₂ = W₂ relu(z) + b₂``), input j's output gradient is ``δ_j = m_j ⊙ W₂ᵀ e_j`` with ``m_j`` its
activation pattern and ``e_j = ∂L/∂z₂`` — on its active units ``δ_j`` lies in the span of ``W₂``'s
C columns (:func:`form_residual`). A mixture of near-duplicate inputs can pass every test
above (its zero set is a ReLU pattern; its null space one-dimensional), but its active values
``Σ_i c_i (W₂ᵀ e_i)_k`` over varying sets of inputs are no such vector. Measured (MLP 512):
true directions leave a relative residual ≤ 2e-4 (medians 1e-7 to 6e-7; faces 0–63, 72–135,
96–159 as 4 × 16 sums, digits batches of 16), the mixtures that passed the other tests on faces
96–159 ≥ 0.09.

**Solving.** With n certified directions ``K`` (any scale), the scales ``s`` solve ``K s = β``
and ``X = (K diag(s))⁻¹ R`` — exact up to the update's rounding (SPEAR's use of the bias): the
sign and scale of every input come out of ``β``, no prior is needed. With n − 1 known, the last
input lies on a line through the origin
(:func:`~fedleak.attacks.exact.relu.direction_search.last_direction`), a one-dimensional search.

This module holds the factorisation and the certificate of one direction; finding directions is
:mod:`~fedleak.attacks.exact.relu.direction_search`, solving
:mod:`~fedleak.attacks.exact.relu.solve`. Everything here is float64 numpy; the update's rounding
(float32 on the wire) is the noise floor, and an ill-conditioned batch (near-duplicate inputs)
raises it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: a zero set ends at a jump of at least this many decades in ``|L q|`` (sorted)
ZERO_GAP_DECADES = 1.0
#: ... whose lower side lies above this many decades under the largest entry (below it sit the
#: rows a null vector was fitted to exactly, at machine precision, not the rounding zeros)
ZERO_FLOOR_DECADES = 12.0
#: a zero set's null space is one-dimensional when σ_min < this × the next singular value
NULLITY_RATIO = 0.5
#: two certified directions are the same input's when their ``|cos|`` exceeds this
SAME_DIRECTION = 0.999
#: the largest relative residual of a certified direction's active values off the classifier's
#: columns (:func:`form_residual`): true directions ≤ 2e-4, mixtures ≥ 0.09 (module docstring)
FORM_TOLERANCE = 3e-3
#: a unit whose gradient row is below this fraction of the largest row is dead (inactive for
#: every input: its row holds only the update's rounding or secure aggregation's quantisation)
DEAD_ROW = 1e-6


class ReluSparsityError(ValueError):
    """The gradient cannot be factorised as the batch's (rank, layer shape)."""


@dataclass(frozen=True)
class FactoredGradient:
    """A linear layer's weight and bias gradients, factorised as ``G = L R`` at rank n."""

    weight: np.ndarray
    bias: np.ndarray
    left: np.ndarray
    right: np.ndarray
    singular_values: np.ndarray
    #: ``left``'s rows scaled to unit length; rows of dead units (zero for every input) are 0
    rows: np.ndarray
    live: np.ndarray
    #: β = L⁺ g: Q's row sums
    totals: np.ndarray

    @property
    def rank(self) -> int:
        """The factorisation's rank n (the batch size): the columns of ``left``."""
        return int(self.left.shape[1])

    def zero_set(self, q: np.ndarray) -> np.ndarray:
        """Return the live rows where ``L q`` vanishes (module docstring), as a bool mask."""
        return zero_set(self.rows @ q, self.live)


def factorise(weight_grad: np.ndarray, bias_grad: np.ndarray, rank: int,
              left_power: float = 0.5) -> FactoredGradient:
    """Factorise ``G = L R`` at ``rank`` (the batch size) by a truncated SVD, in float64.

    ``L = U S^p``, ``R = S^{1−p} Vᵀ`` with ``p = left_power``, and ``β = L⁺ g`` (SPEAR eq. 3–5,
    module docstring).

    Raises
    ------
    ReluSparsityError
        When the bias gradient's shape does not match, or ``rank`` exceeds the layer's shape.
    """
    weight = np.asarray(weight_grad, dtype=np.float64)
    bias = np.asarray(bias_grad, dtype=np.float64).reshape(-1)
    m, d = weight.shape
    if bias.shape != (m,):
        raise ReluSparsityError(f"bias gradient has shape {bias.shape}, expected ({m},)")
    if not 1 <= rank <= min(m, d):
        raise ReluSparsityError(
            f"a batch of {rank} inputs needs a layer with at least {rank} units and {rank} "
            f"input features; this layer's weight is [{m}, {d}]")
    u, s, vt = np.linalg.svd(weight, full_matrices=False)
    left = u[:, :rank] * s[:rank] ** left_power
    right = (s[:rank] ** (1.0 - left_power))[:, None] * vt[:rank]
    norms = np.linalg.norm(left, axis=1)
    live = norms > DEAD_ROW * max(float(norms.max()), 1e-300)
    rows = np.zeros_like(left)
    rows[live] = left[live] / norms[live, None]
    totals = np.linalg.lstsq(left, bias, rcond=None)[0]
    return FactoredGradient(weight, bias, left, right, s, rows, live, totals)


def zero_set(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Mask of the live entries of ``values`` that are zero up to rounding.

    ``log10 |v| / max |v|`` is sorted; the zeros are everything below the widest jump of at
    least :data:`ZERO_GAP_DECADES` whose lower side lies within :data:`ZERO_FLOOR_DECADES` of
    the maximum (the exactly-fitted rows sit far below the rounding zeros, and that jump does
    not count) — or, when there is none (float64 data: every zero is exact), the widest jump.
    No jump of that size: no zeros.
    """
    out = np.zeros(values.shape[0], dtype=bool)
    index = np.flatnonzero(live)
    if index.size < 2:
        return out
    magnitude = np.abs(values[index])
    top = float(magnitude.max())
    if top == 0.0:
        return out
    logs = np.maximum(np.log10(magnitude / top + 1e-300), -20.0)  # below: exactly zero
    order = np.argsort(logs)
    ordered = logs[order]
    jumps = np.diff(ordered)
    above = np.where(ordered[:-1] < -ZERO_FLOOR_DECADES, 0.0, jumps)
    if float(above.max(initial=0.0)) >= ZERO_GAP_DECADES:
        jumps = above  # float64 data without rounding: the exact zeros are the fitted ones
    cut = int(np.argmax(jumps))
    if jumps[cut] >= ZERO_GAP_DECADES:
        out[index[order[: cut + 1]]] = True
    return out


def distinct_rows(rows: np.ndarray) -> int:
    """Count how many of ``rows`` (unit length) differ beyond sign and scale."""
    if rows.shape[0] == 0:
        return 0
    cosines = np.abs(rows @ rows.T) > 1 - 1e-9
    seen = np.zeros(rows.shape[0], dtype=bool)
    count = 0
    for i in range(rows.shape[0]):
        if not seen[i]:
            count += 1
            seen |= cosines[i]
    return count


@dataclass(frozen=True)
class Direction:
    """A certified column of Q: one input's output-gradient direction, and its zero set."""

    q: np.ndarray
    zeros: int
    ratio: float


def certify(grad: FactoredGradient, q: np.ndarray, margin: int,
            layer: tuple[np.ndarray, np.ndarray] | None = None,
            iterations: int = 8, head: np.ndarray | None = None) -> Direction | None:
    """Refine ``q`` to the null vector of its zero set, then test it (module docstring).

    With the layer's ``(weight, bias)``, also test that its zero set is a ReLU pattern of some
    input (:func:`forward_consistent`); with the classifier's weight ``head`` [C, m] (when the
    ReLU feeds it), also that its active values have the classifier's form
    (:func:`form_residual`). Returns the certified direction, or None when a test fails.
    """
    n = grad.rank
    q = q / np.linalg.norm(q)
    ratio = 1.0
    zeros = np.zeros(0, dtype=bool)
    for _ in range(iterations):
        zeros = grad.zero_set(q)
        if zeros.sum() < n - 1 + margin:
            return None
        _, sv, vt = np.linalg.svd(grad.rows[zeros], full_matrices=False)
        refined = vt[-1] * (1.0 if vt[-1] @ q >= 0 else -1.0)
        ratio = float(sv[-1] / max(sv[-2], 1e-300))
        settled = abs(float(refined @ q)) > 1 - 1e-12
        q = refined
        if settled:
            break
    zeros = grad.zero_set(q)
    rows = grad.rows[zeros]
    if (ratio >= NULLITY_RATIO or rows.shape[0] < 2 * (n - 1)
            or distinct_rows(rows) < required_distinct(n, margin) or not robust_null(rows, q)):
        return None
    if head is not None and form_residual(grad, q, zeros, head) > FORM_TOLERANCE:
        return None
    if layer is not None and not forward_consistent(grad, zeros, *layer):
        return None
    return Direction(q, int(zeros.sum()), ratio)


def form_residual(grad: FactoredGradient, q: np.ndarray, zeros: np.ndarray,
                  head: np.ndarray) -> float:
    """Return how far ``L q`` lies from the span of the classifier's columns (relative).

    Measured on the live units outside ``zeros``, against the columns of ``head``ᵀ there: 0 for
    an input's output gradient ``m ⊙ W₂ᵀ e`` (module docstring).
    """
    values = grad.left @ q
    active = grad.live & ~zeros
    basis = np.asarray(head, dtype=np.float64).T[active]                 # [active, C]
    fitted = basis @ np.linalg.lstsq(basis, values[active], rcond=None)[0]
    return float(np.linalg.norm(values[active] - fitted)
                 / max(float(np.linalg.norm(values[active])), 1e-300))


def robust_null(rows: np.ndarray, q: np.ndarray) -> bool:
    """Tell whether a zero set's null space stays one-dimensional without its pinned rows.

    The pinned rows are those ``q`` fits far below the rounding level of the rest.

    An input's zero set has hundreds of rows spanning n − 1 dimensions, all at the rounding
    level of ``L q``. A mixture's zero set spans fewer dimensions but for the few rows the
    mixture was fitted to exactly (the sampled ones, orders of magnitude below the rest):
    without them its null space grows.
    """
    residual = np.abs(rows @ q)
    pinned = residual < 1e-4 * float(np.median(residual))
    kept = rows[~pinned]
    if kept.shape[0] < q.shape[0]:
        return False
    sv = np.linalg.svd(kept, compute_uv=False)
    return bool(sv[-1] < NULLITY_RATIO * sv[-2])


def forward_consistent(grad: FactoredGradient, zeros: np.ndarray, weight: np.ndarray,
                       bias: np.ndarray, tolerance: float = 0.0) -> bool:
    """Tell whether some input in the gradient's row space has a direction's ReLU pattern.

    The pattern is the one the direction's zero set says (units in it inactive, the other live
    units active): a linear program in the n coefficients of ``x = r R`` (SPEAR's ReLU
    consistency, per direction).

    An input's own direction passes (its input is such an x). A mixture whose zero set is not
    a ReLU pattern fails — for a two-class model, ``q_i/α_i − q_j/α_j`` vanishes wherever
    inputs i and j are both active or both inactive (half the units, as many zeros as a true
    direction), and that exclusive-or of two half-space patterns is no half-space pattern.
    A unit disagrees when its constraint needs a slack above 1e-7 (on rows scaled to unit
    length; units at a zero margin need none); up to ``tolerance`` of the live units may (0: a
    mixture of a ten-class digits batch passed with three of 481 units against it).
    """
    from scipy.optimize import linprog

    live = np.flatnonzero(grad.live)
    if live.size == 0:
        return False
    basis = grad.right / np.linalg.norm(grad.right, axis=1, keepdims=True)     # [n, d]
    pre = np.asarray(weight, dtype=np.float64)[live] @ basis.T                  # [k, n]
    offset = np.asarray(bias, dtype=np.float64)[live]
    scale = np.linalg.norm(pre, axis=1) + np.abs(offset) + 1e-300
    sign = np.where(zeros[live], -1.0, 1.0)                                      # want sign·z ≥ 0
    a, c = sign[:, None] * pre / scale[:, None], sign * offset / scale
    n, k = pre.shape[1], live.size
    # minimise Σ slack  s.t.  a r + c + slack ≥ margin,  slack ≥ 0
    cost = np.concatenate([np.zeros(n), np.ones(k)])
    upper = np.concatenate([-a, -np.eye(k)], axis=1)
    result = linprog(cost, A_ub=upper, b_ub=c - 1e-9, bounds=[(None, None)] * n + [(0, None)] * k,
                     method="highs")
    if not result.success:
        return False
    violated = int(np.sum(result.x[n:] > 1e-7))
    return violated <= tolerance * k


def required_distinct(n: int, margin: int) -> int:
    """Return how many distinct zero rows a direction needs.

    ``n − 1 + margin``, but at most the ``2^{n−1} − 1`` activation patterns of the other inputs
    (a two-class model's rows are equal up to scale within a pattern, so a batch of 4 has only
    7 distinct rows in a zero set).
    """
    if n - 1 < 30:
        patterns: int = 2 ** (n - 1) - 1
        return min(n - 1 + margin, patterns)
    return n - 1 + margin


def default_margin(n: int) -> int:
    """Return how many distinct zero rows beyond n − 1 a certified direction needs."""
    return max(8, n // 4)
