"""Exact inputs of a linear layer followed by ReLU, from the sparsity of its output gradient
(Dimitrov et al., "SPEAR: Exact Gradient Inversion of Batches in Federated Learning", NeurIPS
2024, Sec. 3–4): the maths that :mod:`~fedleak.attacks.spear` and
:mod:`~fedleak.attacks.cocktail_party` share.

**The factorisation.** A linear layer ``Z = X Wᵀ + b`` (``W`` of shape [m, d]) on a batch of n
inputs ``X`` [n, d] has, for any loss, the gradients

    G := ∂L/∂W = Dᵀ X,        g := ∂L/∂b = Dᵀ 1,        D := ∂L/∂Z  [n, m],

so ``G`` has rank n (when n ≤ m, n ≤ d and the inputs are independent). A truncated SVD gives
``G = L R`` with ``L`` [m, n] and ``R`` [n, d] (``L = U√S``, ``R = √S Vᵀ``), and because ``Dᵀ``
spans the same columns as ``L`` there is an invertible ``Q`` [n, n] with

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

**Solving.** With n certified directions ``K`` (any scale), the scales ``s`` solve ``K s = β``
and ``X = (K diag(s))⁻¹ R`` — exact up to the update's rounding (SPEAR's use of the bias): the
sign and scale of every input come out of ``β``, no prior is needed. With n − 1 known, the last
input lies on a line through the origin (:func:`last_direction`), a one-dimensional search.

Everything here is float64 numpy; the update's rounding (float32 on the wire) is the noise
floor, and an ill-conditioned batch (near-duplicate inputs) raises it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

#: a zero set ends at a jump of at least this many decades in ``|L q|`` (sorted)
ZERO_GAP_DECADES = 1.0
#: ... whose lower side lies above this many decades under the largest entry (below it sit the
#: rows a null vector was fitted to exactly, at machine precision, not the rounding zeros)
ZERO_FLOOR_DECADES = 12.0
#: a zero set's null space is one-dimensional when σ_min < this × the next singular value
NULLITY_RATIO = 0.5
#: two certified directions are the same input's when their ``|cos|`` exceeds this
SAME_DIRECTION = 0.999
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
        return int(self.left.shape[1])

    def zero_set(self, q: np.ndarray) -> np.ndarray:
        """The live rows where ``L q`` vanishes (module docstring), as a bool mask."""
        return zero_set(self.rows @ q, self.live)


def factorise(weight_grad: np.ndarray, bias_grad: np.ndarray, rank: int) -> FactoredGradient:
    """``G = L R`` at ``rank`` (the batch size) by a truncated SVD, in float64."""
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
    root = np.sqrt(s[:rank])
    left, right = u[:, :rank] * root, root[:, None] * vt[:rank]
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
    """How many of ``rows`` (unit length) differ beyond sign and scale."""
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
            iterations: int = 8) -> Direction | None:
    """Refine ``q`` to the null vector of its zero set, then test it (module docstring); with
    the layer's ``(weight, bias)``, also that its zero set is a ReLU pattern of some input
    (:func:`forward_consistent`)."""
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
    if layer is not None and not forward_consistent(grad, zeros, *layer):
        return None
    return Direction(q, int(zeros.sum()), ratio)


def robust_null(rows: np.ndarray, q: np.ndarray) -> bool:
    """Whether a zero set's null space stays one-dimensional without the rows ``q`` fits far
    below the rounding level of the rest.

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
    """Whether some input in the gradient's row space has the activation pattern a direction's
    zero set says (units in it inactive, the other live units active): a linear program in the
    n coefficients of ``x = r R`` (SPEAR's ReLU consistency, per direction).

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
    """Distinct zero rows a direction needs: ``n − 1 + margin``, but at most the ``2^{n−1} − 1``
    activation patterns of the other inputs (a two-class model's rows are equal up to scale
    within a pattern, so a batch of 4 has only 7 distinct rows in a zero set)."""
    if n - 1 < 30:
        return min(n - 1 + margin, 2 ** (n - 1) - 1)
    return n - 1 + margin


def default_margin(n: int) -> int:
    """Distinct zero rows beyond n − 1 a certified direction needs."""
    return max(8, n // 4)


def direction_from_ranked_rows(grad: FactoredGradient, ranked: np.ndarray, margin: int,
                               layer: tuple[np.ndarray, np.ndarray] | None = None,
                               pools: tuple[float, ...] = (1.0, 1.3, 1.8)
                               ) -> Direction | None:
    """A certified direction from rows ranked most-likely-zero first (an input estimate's most
    negative pre-activations): the null vector of the first n − 1 live rows, then of larger
    pools (``pools`` × n rows) trimmed of their worst row until one is exactly null."""
    n = grad.rank
    ranked = np.asarray([k for k in ranked if grad.live[k]])
    for factor in pools:
        pool = list(ranked[: max(n - 1, int(factor * n))])
        while len(pool) >= n - 1:
            _, sv, vt = np.linalg.svd(grad.rows[pool], full_matrices=True)
            q = vt[-1]
            if len(pool) == n - 1 or sv[-1] < 1e-3 * sv[-2]:
                found = certify(grad, q, margin, layer)
                if found is not None:
                    return found
                if len(pool) == n - 1:
                    break
            pool.pop(int(np.argmax(np.abs(grad.rows[pool] @ q))))
    return None


def direction_near(grad: FactoredGradient, start: np.ndarray, margin: int,
                   layer: tuple[np.ndarray, np.ndarray] | None = None,
                   known: np.ndarray | None = None, fraction: float = 0.25,
                   iterations: int = 10) -> Direction | None:
    """A certified direction near ``start`` (an estimate of a column of Q, e.g. ``L⁺ a`` for
    an estimated mixing column ``a``): repeatedly take the ``fraction`` of live rows where
    ``L q`` is smallest — mostly the input's zeros when ``q`` is close — and move ``q`` to their
    null vector; then :func:`certify`. With ``known`` columns, ``q`` stays in ``start +
    span(known)`` (an estimate made after those inputs were projected out)."""
    n = grad.rank
    live = np.flatnonzero(grad.live)
    count = min(live.size, max(2 * (n - 1), int(fraction * live.size)))
    q = start / max(np.linalg.norm(start), 1e-300)
    for _ in range(iterations):
        rows = live[np.argsort(np.abs(grad.rows[live] @ q))[:count]]
        if known is not None and known.shape[1]:
            block = grad.rows[rows]
            shift = np.linalg.lstsq(block @ known, -(block @ q), rcond=None)[0]
            moved = q + known @ shift
        else:
            moved = np.linalg.svd(grad.rows[rows], full_matrices=False)[2][-1]
        moved = moved / max(np.linalg.norm(moved), 1e-300)
        moved = moved * (1.0 if moved @ q >= 0 else -1.0)
        settled = abs(float(moved @ q)) > 1 - 1e-14
        q = moved
        if settled:
            break
    return certify(grad, q, margin, layer)


@dataclass
class DirectionSet:
    """Certified directions found so far, one per input (duplicates dropped)."""

    rank: int
    found: list[Direction] = field(default_factory=list)

    def add(self, direction: Direction | None) -> bool:
        """Keep ``direction`` when it is new; whether it was."""
        if direction is None or len(self.found) >= self.rank:
            return False
        if any(abs(float(direction.q @ d.q)) > SAME_DIRECTION for d in self.found):
            return False
        self.found.append(direction)
        return True

    def columns(self) -> np.ndarray:
        """``[n, k]``: the directions found, as columns."""
        if not self.found:
            return np.zeros((self.rank, 0))
        return np.stack([d.q for d in self.found], axis=1)


def last_direction(grad: FactoredGradient, columns: np.ndarray,
                   layer: tuple[np.ndarray, np.ndarray], margin: int) -> Direction | None:
    """The last column of Q once n − 1 are known, by a search along one line.

    The last input's row of Q⁻¹ is orthogonal to the n − 1 known columns, so the input is
    ``x = c · r̂ R`` for the unit ``r̂`` spanning their orthogonal complement and an unknown
    ``c`` (sign and scale). Its ReLU pattern ``c · W r̂ R + b > 0`` changes only where ``c``
    crosses a unit's breakpoint ``−b_k / (W r̂ R)_k``: at most m + 1 patterns, and the true
    ``c``'s is the input's zero set, whose rows have an exact null vector — the direction.
    """
    weight, bias = (np.asarray(t, dtype=np.float64) for t in layer)
    n = grad.rank
    complement = np.linalg.svd(columns.T, full_matrices=True)[2][-1]           # r̂ ⊥ known q's
    pre = weight @ (complement @ grad.right)
    live = grad.live & (np.abs(pre) > 1e-12 * np.abs(pre).max())
    points = np.sort(-bias[live] / pre[live])
    probes = np.concatenate([[points[0] - 1.0], (points[1:] + points[:-1]) / 2,
                             [points[-1] + 1.0]]) if points.size else np.zeros(0)
    best, best_ratio = None, np.inf
    for c in probes:
        zeros = grad.live & (c * pre + bias <= 0)
        if zeros.sum() < n - 1 + margin:
            continue
        _, sv, vt = np.linalg.svd(grad.rows[zeros], full_matrices=False)
        ratio = sv[-1] / max(sv[-2], 1e-300)
        if ratio < best_ratio:
            best, best_ratio = vt[-1], ratio
    if best is None:
        return None
    return certify(grad, best, margin, layer)


def solve_inputs(grad: FactoredGradient, columns: np.ndarray) -> np.ndarray:
    """The inputs ``X = Q⁻¹ R`` [n, d] from n columns of Q of any scale (scales from β)."""
    if columns.shape != (grad.rank, grad.rank):
        raise ReluSparsityError(f"need {grad.rank} directions, got {columns.shape[1]}")
    scales = np.linalg.lstsq(columns, grad.totals, rcond=None)[0]
    return np.linalg.solve(columns * scales[None, :], grad.right)


def solve_checked(grad: FactoredGradient, found: DirectionSet,
                  layer: tuple[np.ndarray, np.ndarray], agree: float = 0.99
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """Solve with the n directions found, then check every input's ReLU pattern against its
    direction's zero set (:func:`activation_agreement`). When some disagree, a direction was a
    mixture that passed the tests: those are dropped from ``found`` and None is returned (search
    on); otherwise the inputs and their agreements."""
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
    """Per recovered input, the fraction of live units where the ReLU the forward pass gives
    (``x Wᵀ + b > 0``) agrees with the output gradient's support (``L q ≠ 0``): 1.0 for an
    exact recovery (SPEAR's consistency check)."""
    forward = inputs @ np.asarray(weight, dtype=np.float64).T + np.asarray(bias, np.float64)
    agree = np.zeros(inputs.shape[0])
    live = grad.live
    for j in range(inputs.shape[0]):
        active = ~grad.zero_set(columns[:, j])
        agree[j] = float(np.mean((forward[j] > 0)[live] == active[live]))
    return agree


def sample_directions(
    grad: FactoredGradient,
    directions: DirectionSet,
    *,
    samples: int,
    seconds: float,
    margin: int,
    rng: np.random.Generator,
    layer: tuple[np.ndarray, np.ndarray] | None = None,
    batch: int = 2048,
    stop_at: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """SPEAR's search: null vectors of random sets of n − 1 live rows, each certified
    (:func:`certify`), until ``stop_at`` directions are held (default n − 1: the last comes from
    β), ``samples`` sets were tried or ``seconds`` passed. Returns how many sets were tried.

    A set finds input j's direction when all its rows lie in j's zero set: for zero fraction
    f, with probability about f^{n−1} per input, so the expected number of sets grows like
    2^{n−1} at f = ½ — the reason the batch must be small.
    """
    n = grad.rank
    stop_at = n - 1 if stop_at is None else stop_at
    live = np.flatnonzero(grad.live)
    if live.size < n - 1:
        return 0
    rows = torch.from_numpy(grad.rows)
    started = time.perf_counter()
    tried = 0
    while (tried < samples and len(directions.found) < stop_at
           and time.perf_counter() - started < seconds):
        size = min(batch, samples - tried)
        chosen = np.argsort(rng.random((size, live.size)), axis=1)[:, : n - 1]
        subsets = rows[torch.from_numpy(live[chosen])]            # [B, n − 1, n]
        null = torch.linalg.svd(subsets).Vh[:, -1, :]             # [B, n]
        values = (rows @ null.T).abs()                            # [m, B]
        small = (values < 1e-4 * values.max(dim=0).values).sum(dim=0)
        for b in torch.nonzero(small >= n - 1 + margin).flatten().tolist():
            directions.add(certify(grad, null[b].numpy(), margin, layer))
            if len(directions.found) >= stop_at:
                break
        tried += size
        if progress is not None:
            progress(tried, samples)
    return tried
