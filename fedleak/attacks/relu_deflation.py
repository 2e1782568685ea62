"""Certify-and-deflate through a ReLU (an extension of the Cocktail Party Attack beyond the
paper; the attack is :mod:`~fedleak.attacks.cocktail_party`, whose module docstring gives the
idea): each ICA estimate points at its input's exact mixing direction when a ReLU follows the
layer (SPEAR's certified zeros, :mod:`~fedleak.attacks.relu_sparsity`); certified columns are
projected off the mixture and the rest unmixed again, until every input is certified and solved
exactly, or the rounds stop.
"""

from __future__ import annotations

import time

import numpy as np

from fedleak.attacks import relu_sparsity as rs
from fedleak.attacks.cocktail_party_options import CocktailPartyConfig
from fedleak.attacks.fc_layer import expected_sets
from fedleak.attacks.ica_unmixing import unmix
from fedleak.attacks.relu_direction_search import (
    DirectionSet,
    direction_from_ranked_rows,
    direction_near,
    last_direction,
    sample_directions,
)
from fedleak.attacks.relu_solve import solve_inputs

#: sampled sets the certify-and-deflate rounds may add (SPEAR's search for the last inputs of
#: a small batch; only when the expected number is within it)
SAMPLING_BUDGET = 1_000_000


def relu_refinement(cfg: CocktailPartyConfig, mixtures: np.ndarray, totals: np.ndarray,
                    inputs: np.ndarray, count: int, forward: tuple[np.ndarray, np.ndarray],
                    shape: tuple[int, int, int] | None, seed: int
                    ) -> tuple[np.ndarray, list[int]]:
    """Certify, deflate, repeat; solve exactly when every input is certified (module
    docstring). Returns the inputs and how many were certified in each round (a last
    entry for the sampling search, when it ran).

    Each estimate's direction starts at its estimated mixing column, ``q = L⁺ a_j`` with
    ``A = G X̂⁺`` (after deflation: the projected mixture's, moved only along the certified
    directions), and is refined to the input's zero set
    (:func:`~fedleak.attacks.relu_direction_search.direction_near`); failing that, from the n − 1
    rows its pre-activations rank most negative. When the rounds stop short with an input
    certified (so the update has exact zeros) and the batch is small enough for SPEAR's
    sampling (``expected_sets`` within its budget), the remaining directions are sampled
    within the time left.
    """
    grad = rs.factorise(mixtures, totals, count)
    margin = rs.default_margin(count)
    found = DirectionSet(count)
    estimates = inputs.copy()
    seen: list[np.ndarray] = list(inputs)     # every estimate made, for partial results
    projected = mixtures
    left_pinv = np.linalg.pinv(grad.left)
    history: list[int] = []
    started = time.perf_counter()
    for round_ in range(cfg.rounds):
        if time.perf_counter() - started > cfg.time_limit:
            break
        known = found.columns()
        starts = left_pinv @ (projected @ np.linalg.pinv(estimates))       # [n, k]
        added = 0
        for j, x in enumerate(estimates):
            direction = direction_near(grad, starts[:, j], margin, forward,
                                          known=known if known.shape[1] else None)
            if direction is None:
                ranked = np.argsort(x @ forward[0].T + forward[1])
                direction = direction_from_ranked_rows(grad, ranked, margin, forward,
                                                          pools=(1.0,))
            added += found.add(direction)
        if count - len(found.found) == 1:
            added += found.add(last_direction(grad, found.columns(), forward, margin))
        history.append(added)
        remaining = count - len(found.found)
        if remaining == 0:
            return solve_inputs(grad, found.columns()), history
        if added == 0 and round_ > 0:
            break
        known_mixing = grad.left @ found.columns()
        projector = np.eye(mixtures.shape[0]) - known_mixing @ np.linalg.pinv(known_mixing)
        projected = projector @ mixtures
        estimates = unmix(projected, projector @ totals, remaining, cfg, shape,
                          seed + round_ + 1).inputs
        seen += list(estimates)
    left = cfg.time_limit - (time.perf_counter() - started)
    if left > 0 and expected_sets(count) <= SAMPLING_BUDGET and \
            found.found:  # an input certified: the update has exact zeros to sample
        before = len(found.found)
        sample_directions(grad, found, samples=SAMPLING_BUDGET, seconds=left,
                             margin=margin, rng=np.random.default_rng(seed), layer=forward)
        if count - len(found.found) == 1:
            found.add(last_direction(grad, found.columns(), forward, margin))
        history.append(len(found.found) - before)
        if len(found.found) == count:
            return solve_inputs(grad, found.columns()), history
    return partial_inputs(grad, found, seen, estimates, forward), history

def partial_inputs(grad: rs.FactoredGradient, found: DirectionSet, seen: list[np.ndarray],
                   estimates: np.ndarray, forward: tuple[np.ndarray, np.ndarray]
                   ) -> np.ndarray:
    """When not every input was certified. Certified input k: the estimate (of all made)
    whose ReLU pattern agrees best with its direction's zero set, with the other certified
    inputs projected out (``x = r R``, ``r ⊥ q_j`` for the other certified j, nearest the
    estimate); the rest: the last deflated ICA estimates."""
    columns = found.columns()
    right_pinv = np.linalg.pinv(grad.right)
    pool = np.stack(seen)
    active = pool @ forward[0].T + forward[1] > 0                       # [estimates, m]
    live = grad.live
    out = []
    for j in range(columns.shape[1]):
        zeros = grad.zero_set(columns[:, j])
        agreement = ((~active[:, live]) == zeros[live]).mean(axis=1)
        x = pool[int(np.argmax(agreement))]
        others = np.delete(columns, j, axis=1)
        coefficients = x @ right_pinv
        if others.shape[1]:
            coefficients = coefficients - (coefficients @ others) @ np.linalg.pinv(others)
        projected = coefficients @ grad.right
        scale = float(projected @ x) / max(float(projected @ projected), 1e-300)
        out.append(scale * projected)
    out += list(estimates[: grad.rank - len(out)])
    return np.stack(out) if out else estimates
