"""Certify-and-deflate through a ReLU, an extension of the Cocktail Party Attack beyond the paper.

The attack is :mod:`~fedleak.attacks.exact.cocktail_party.cpa`, whose module docstring
gives the idea: each ICA estimate points at its input's exact mixing direction when a ReLU follows
the layer (SPEAR's certified zeros, :mod:`~fedleak.attacks.exact.relu.sparsity`); certified columns
are projected off the mixture and the rest unmixed again, until every input is certified and solved
exactly, or the work budget is spent.

**One round** (the budget counts rounds: each is one FastICA unmixing and one search from
each of its estimates): every estimate gives two starts — its estimated mixing column
(``L⁺ a_j`` with ``A = G X̂⁺``; after a deflation, the projected mixture's column moved along
the known directions to the estimate's predicted zeros,
:func:`~fedleak.attacks.exact.relu.direction_search.shifted_start`) and, when the layer is over the
image, its one-image replay (:class:`~fedleak.attacks.exact.relu.replay_starts.ReplayStarts`) — each
refined to a certified direction or dropped
(:func:`~fedleak.attacks.exact.relu.direction_search.direction_near`). The search runs in the
orthonormal factorisation (``left_power = 0``), whose basins are wider than SPEAR's ``√S``
one on near-duplicate images. A round that certifies nothing is a *stall*: the next one
unmixes again with another seed and the other contrast (a restart); ``patience`` stalls in a
row end the rounds.

**Consolidation.** After each round's deflation and unmixing, the inputs are solved jointly
from the certified directions and, for the rest, the starts of the new estimates
(``X = Q̂⁻¹ R`` with ``Q̂ = [K, Q̂_U]``, scales from the bias): the certified inputs then carry
only the error of the uncertified directions' starts, and each is projected onto the images
its certificate allows (:mod:`~fedleak.attacks.exact.relu.pattern_projection`: its exact ReLU
pattern, in the box). These better estimates give the uncertified inputs new mixing starts in the
whole mixture, searched like the others. Measured on faces 72–135 (4 × 16 sum, seed 1, 36 of 64
certified): 29 images at ≥ 20 dB from the joint solve, 36 projected, and 3 more directions
from the new starts.

**When rounds stop short.** A small batch with an input certified (the update has exact
zeros) samples the rest SPEAR's way within ``samples`` sets. Otherwise the result is the last
consolidation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedleak.attacks.exact.cocktail_party.cpa_options import CONTRASTS, CocktailPartyConfig
from fedleak.attacks.exact.cocktail_party.unmixing import unmix
from fedleak.attacks.exact.fc_layer import expected_sets
from fedleak.attacks.exact.relu import sparsity as rs
from fedleak.attacks.exact.relu.direction_search import (
    DirectionSet,
    direction_near,
    last_direction,
    sample_directions,
    shifted_start,
)
from fedleak.attacks.exact.relu.pattern_projection import project_certified
from fedleak.attacks.exact.relu.replay_starts import ReplayStarts
from fedleak.attacks.exact.relu.solve import solve_checked, solve_inputs
from fedleak.attacks.safety_limit import SafetyLimit

#: the factorisation's power of S on the left factor for the search (module docstring)
SEARCH_LEFT_POWER = 0.0


@dataclass
class Refinement:
    """What certify-and-deflate recovered and what it spent."""

    inputs: np.ndarray
    #: directions certified in each round (a last entry for the sampling search, when it ran)
    history: list[int]
    solved: bool
    #: directions certified in all (mixtures a solve found among them are not counted)
    certified: int
    rounds: int
    sets: int
    #: the safety limit's sentence when it cut the work (:mod:`~fedleak.attacks.safety_limit`)
    truncated: str | None


@dataclass
class Search:
    """The factored gradient, what the search may use, and the directions found."""

    grad: rs.FactoredGradient
    left_pinv: np.ndarray
    forward: tuple[np.ndarray, np.ndarray]
    margin: int
    head: np.ndarray | None
    replay: ReplayStarts | None
    found: DirectionSet
    #: the image box per input value (None: the inputs are features)
    box: tuple[np.ndarray, np.ndarray] | None = None

    def from_estimates(self, projected: np.ndarray, estimates: np.ndarray,
                       limit: SafetyLimit) -> int:
        """Search from ``estimates`` of ``projected``, one round (module docstring).

        Returns the number of directions certified.
        """
        known = self.found.columns()
        starts = self.left_pinv @ (projected @ np.linalg.pinv(estimates))
        added = 0
        for j, estimate in enumerate(estimates):
            if limit.expired() or len(self.found.found) == self.grad.rank:
                break
            start = starts[:, j] if not known.shape[1] else \
                shifted_start(self.grad, starts[:, j], estimate, known, self.forward)
            added += self.found.add(direction_near(self.grad, start, self.margin, self.forward,
                                                   head=self.head))
            if self.replay is not None and len(self.found.found) < self.grad.rank:
                replayed = self.replay.start(self.grad, self.left_pinv, estimate)
                added += self.found.add(direction_near(self.grad, replayed, self.margin,
                                                       self.forward, head=self.head))
        if self.grad.rank - len(self.found.found) == 1:
            added += self.found.add(last_direction(self.grad, self.found.columns(),
                                                   self.forward, self.margin, head=self.head))
        return added

    def from_consolidation(self, mixtures: np.ndarray, consolidated: np.ndarray,
                           limit: SafetyLimit) -> int:
        """Search from the whole mixture's columns at the consolidated inputs.

        Only for the uncertified inputs (rows after the certified); returns the number of
        directions certified.
        """
        known = self.found.columns().shape[1]
        starts = self.left_pinv @ (mixtures @ np.linalg.pinv(consolidated))
        added = 0
        for j in range(known, consolidated.shape[0]):
            if limit.expired() or len(self.found.found) == self.grad.rank:
                break
            added += self.found.add(direction_near(self.grad, starts[:, j], self.margin,
                                                   self.forward, head=self.head))
        return added

    def deflated(self, mixtures: np.ndarray, totals: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Return ``G`` and ``g`` projected off the certified inputs' mixing columns.

        With ``K`` those columns, the projector is ``I − K K⁺``.
        """
        known_mixing = self.grad.left @ self.found.columns()
        projector = np.eye(mixtures.shape[0]) - known_mixing @ np.linalg.pinv(known_mixing)
        return projector @ mixtures, projector @ totals


def relu_refinement(cfg: CocktailPartyConfig, mixtures: np.ndarray, totals: np.ndarray,
                    inputs: np.ndarray, count: int, forward: tuple[np.ndarray, np.ndarray],
                    shape: tuple[int, int, int] | None, seed: int, *,
                    replay: ReplayStarts | None = None, head: np.ndarray | None = None,
                    box: tuple[np.ndarray, np.ndarray] | None = None,
                    limit: SafetyLimit | None = None) -> Refinement:
    """Certify, deflate, repeat within ``cfg.rounds`` rounds (module docstring).

    Solve exactly when every input is certified, else jointly. ``inputs`` are the first
    unmixing's estimates; ``replay`` and ``head`` what a replay offers (None: not used); ``box``
    the image box per input value (None: features).
    """
    limit = limit or SafetyLimit(cfg.time_limit)
    grad = rs.factorise(mixtures, totals, count, left_power=SEARCH_LEFT_POWER)
    search = Search(grad, np.linalg.pinv(grad.left), forward, rs.default_margin(count), head,
                    replay, DirectionSet(count), box)
    found = search.found
    estimates, projected, projected_totals = inputs, mixtures, totals
    history: list[int] = []
    rounds = stalled = 0
    while rounds < cfg.rounds and not limit.expired():
        rounds += 1
        added = search.from_estimates(projected, estimates, limit)
        if len(found.found) < count:
            projected, projected_totals = search.deflated(mixtures, totals)
            contrast = cfg.contrast if (stalled + (added == 0)) % 2 == 0 else next(
                c for c in CONTRASTS if c != cfg.contrast)
            estimates = unmix(projected, projected_totals, count - len(found.found),
                              dataclasses.replace(cfg, contrast=contrast), shape,
                              seed + rounds).inputs
            if found.found:
                added += search.from_consolidation(
                    mixtures, consolidate(search, projected, estimates), limit)
        history.append(added)
        if len(found.found) == count:
            solved = solve_checked(grad, found, forward)
            if solved is not None:
                return Refinement(solved[0], history, True, count, rounds, 0, None)
            added = 0                     # a mixture was dropped: search on
        stalled = 0 if added else stalled + 1
        if stalled > cfg.patience:
            break
    sets = 0
    if found.found and len(found.found) < count and not limit.expired() and \
            expected_sets(count) <= cfg.samples:  # exact zeros, a batch small enough to sample
        before = len(found.found)
        sets = sample_directions(grad, found, samples=cfg.samples, seconds=limit.left(),
                                 margin=search.margin, rng=np.random.default_rng(seed),
                                 layer=forward, head=head)
        if count - len(found.found) == 1:
            found.add(last_direction(grad, found.columns(), forward, search.margin, head=head))
        history.append(len(found.found) - before)
        if len(found.found) == count:
            solved = solve_checked(grad, found, forward)
            if solved is not None:
                return Refinement(solved[0], history, True, count, rounds, sets, None)
    truncated = limit.reason(f"{rounds} of {cfg.rounds} certify-and-deflate rounds"
                             + (f" and {sets} of {cfg.samples} sampled sets" if sets else ""))
    remaining = count - len(found.found)
    if not found.found:
        return Refinement(estimates, history, False, 0, rounds, sets, truncated)
    if estimates.shape[0] != remaining:   # directions were added since the last unmixing
        projected, projected_totals = search.deflated(mixtures, totals)
        estimates = unmix(projected, projected_totals, remaining, cfg, shape,
                          seed + rounds + 1).inputs if remaining else estimates[:0]
    return Refinement(consolidate(search, projected, estimates), history, False,
                      len(found.found), rounds, sets, truncated)


def consolidate(search: Search, projected: np.ndarray, estimates: np.ndarray) -> np.ndarray:
    """Return the certified inputs first, then the others, solved jointly.

    Solved from the certified directions and the starts of ``estimates`` (of the rest, unmixed
    from ``projected``), the certified ones projected onto their certificates' sets (module
    docstring); the estimates alone beside each certified direction's own solve when the joint
    solve is singular.
    """
    grad, known = search.grad, search.found.columns()
    remaining = grad.rank - known.shape[1]
    starts = search.left_pinv @ (projected @ np.linalg.pinv(estimates)) if remaining else \
        np.zeros((grad.rank, 0))
    columns = [known] + [shifted_start(grad, starts[:, j], estimates[j], known, search.forward)
                         [:, None] for j in range(remaining)]
    square = np.hstack(columns)
    if np.linalg.matrix_rank(square) < grad.rank:
        return np.vstack([certified_estimates(search), estimates])
    solved = solve_inputs(grad, square)
    solved[: known.shape[1]] = project_certified(grad, known, solved[: known.shape[1]],
                                                 search.forward, search.box)
    return solved


def certified_estimates(search: Search) -> np.ndarray:
    """Return each certified input from its direction alone.

    ``x = r R`` with ``r`` the row of the pseudo-inverse of the known directions, scaled by the
    least-squares fit of the bias totals (exact when every input is certified).
    """
    known = search.found.columns()
    rows = np.linalg.pinv(known)
    scales = np.linalg.lstsq(known, search.grad.totals, rcond=None)[0]
    inputs: np.ndarray = (rows / np.where(np.abs(scales) > 1e-300, scales, 1e-300)[:, None]) \
        @ search.grad.right
    return inputs
