"""Searches for the certified directions of a ReLU layer's factored gradient.

Dimitrov et al., "SPEAR", NeurIPS 2024, Sec. 4; the maths in
:mod:`~fedleak.attacks.exact.relu.sparsity`.

Four ways to a column of Q, each ending in :func:`~fedleak.attacks.exact.relu.sparsity.certify`:
from rows ranked most-likely-zero (:func:`direction_from_ranked_rows`), near an estimate
(:func:`direction_near`, from a start that :func:`shifted_start` may first move along the known
directions), along one line once n − 1 are known (:func:`last_direction`), and SPEAR's random
sampling of n − 1 live rows (:func:`sample_directions`). :class:`DirectionSet` holds the
directions found, one per input. ``head`` (the classifier's weight, when the ReLU feeds it) is
passed on to the certificate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedleak.attacks.exact.relu.sparsity import SAME_DIRECTION, Direction, FactoredGradient, certify


def direction_from_ranked_rows(grad: FactoredGradient, ranked: np.ndarray, margin: int,
                               layer: tuple[np.ndarray, np.ndarray] | None = None,
                               pools: tuple[float, ...] = (1.0, 1.3, 1.8),
                               head: np.ndarray | None = None) -> Direction | None:
    """Find a certified direction from rows ranked most-likely-zero first.

    The ranking is an input estimate's most negative pre-activations. Take the null vector of
    the first n − 1 live rows, then of larger pools (``pools`` × n rows) trimmed of their worst
    row until one is exactly null; None when no pool certifies.
    """
    n = grad.rank
    ranked = np.asarray([k for k in ranked if grad.live[k]])
    for factor in pools:
        pool = list(ranked[: max(n - 1, int(factor * n))])
        while len(pool) >= n - 1:
            _, sv, vt = np.linalg.svd(grad.rows[pool], full_matrices=True)
            q = vt[-1]
            if len(pool) == n - 1 or sv[-1] < 1e-3 * sv[-2]:
                found = certify(grad, q, margin, layer, head=head)
                if found is not None:
                    return found
                if len(pool) == n - 1:
                    break
            pool.pop(int(np.argmax(np.abs(grad.rows[pool] @ q))))
    return None


def direction_near(grad: FactoredGradient, start: np.ndarray, margin: int,
                   layer: tuple[np.ndarray, np.ndarray] | None = None,
                   known: np.ndarray | None = None, fraction: float = 0.25,
                   iterations: int = 10, head: np.ndarray | None = None) -> Direction | None:
    """Find a certified direction near ``start``, an estimate of a column of Q.

    ``start`` is e.g. ``L⁺ a`` for an estimated mixing column ``a``. Repeatedly take the
    ``fraction`` of live rows where ``L q`` is smallest — mostly the input's zeros when ``q`` is
    close — and move ``q`` to their null vector; then
    :func:`~fedleak.attacks.exact.relu.sparsity.certify`. With ``known`` columns, ``q`` stays in
    ``start + span(known)`` (an estimate made after those inputs were projected out).
    """
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
    return certify(grad, q, margin, layer, head=head)


def shifted_start(grad: FactoredGradient, start: np.ndarray, estimate: np.ndarray,
                  known: np.ndarray, layer: tuple[np.ndarray, np.ndarray],
                  fraction: float = 0.8) -> np.ndarray:
    """Return a start for an input estimated after the ``known`` directions were projected out.

    The projected mixture's column ``start`` is input j's direction less its part along the
    known ones: ``q_j = start + K s`` for some ``s``. ``q_j`` vanishes on j's inactive units,
    which the estimate predicts (its most negative pre-activations ``W x̂ + b``): ``s`` is
    the least-squares fit of ``(start + K s)`` to zero on the ``fraction`` of those units the
    estimate is surest of. (Ranking the units by ``|start|`` instead, as :func:`direction_near`
    does with ``known``, picks the start's small entries, not the input's zeros: on faces
    96–159 with 40 directions known, it refined none of 24 exact estimates; this refines all.)
    """
    weight, bias = layer
    pre = np.asarray(weight, dtype=np.float64) @ estimate + np.asarray(bias, dtype=np.float64)
    live = np.flatnonzero(grad.live)
    order = live[np.argsort(pre[live])]
    inactive = int(np.sum(pre[live] < 0))
    chosen = order[: max(int(fraction * inactive), known.shape[1] + 8)]
    block = grad.rows[chosen]
    shift = np.linalg.lstsq(block @ known, -(block @ start), rcond=None)[0]
    moved: np.ndarray = start + known @ shift
    return moved / max(float(np.linalg.norm(moved)), 1e-300)


@dataclass
class DirectionSet:
    """Certified directions found so far, one per input (duplicates dropped)."""

    rank: int
    found: list[Direction] = field(default_factory=list)

    def add(self, direction: Direction | None) -> bool:
        """Keep ``direction`` when it is new; return whether it was kept."""
        if direction is None or len(self.found) >= self.rank:
            return False
        if any(abs(float(direction.q @ d.q)) > SAME_DIRECTION for d in self.found):
            return False
        self.found.append(direction)
        return True

    def columns(self) -> np.ndarray:
        """Return the directions found as the columns of an ``[n, k]`` array."""
        if not self.found:
            return np.zeros((self.rank, 0))
        return np.stack([d.q for d in self.found], axis=1)


def last_direction(grad: FactoredGradient, columns: np.ndarray,
                   layer: tuple[np.ndarray, np.ndarray], margin: int,
                   head: np.ndarray | None = None) -> Direction | None:
    """Find the last column of Q once n − 1 are known, by a search along one line.

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
    return certify(grad, best, margin, layer, head=head)


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
    head: np.ndarray | None = None,
) -> int:
    """Search SPEAR's way: null vectors of random sets of n − 1 live rows, each certified.

    Certified by :func:`~fedleak.attacks.exact.relu.sparsity.certify`, until ``stop_at``
    directions are held (default n − 1: the last comes from β), ``samples`` sets were tried or
    ``seconds`` passed. Returns how many sets were tried.

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
            directions.add(certify(grad, null[b].numpy(), margin, layer, head=head))
            if len(directions.found) >= stop_at:
                break
        tried += size
        if progress is not None:
            progress(tried, samples)
    return tried
