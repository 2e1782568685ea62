"""What the victim keeps of an audit as a run: every release's values at a sample of
coordinates away from the canaries, in release order, with its cell, and the noise moments of
the canary-free releases.

The tests across releases and across coordinates (:mod:`fedleak.auditing.estimators.
fresh_noise`, :mod:`~fedleak.auditing.estimators.noise_correlation`) read the sample as
:class:`~fedleak.auditing.estimators.releases.Releases`; the canary-free test
(:mod:`~fedleak.auditing.estimators.canary_free`) reads the moments as
:class:`~fedleak.auditing.estimators.noise_level.NoiseLevels`. The sample takes the same
offsets in every tensor where they are free (a random order of offsets shared by all
tensors), so noise copied from one tensor to another meets itself in the across-tensor pairs.
A release's cell is (stratum, primary coin where it rescales the update, canary-free or not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedleak.auditing.estimators.noise_level import NoiseLevels
from fedleak.auditing.estimators.releases import Releases

#: coordinates per tensor (and in all) whose every release is kept
RELEASE_COORDINATES = 256
MAX_RELEASE_COORDINATES = 2048


class Moments:
    """Running Σ(x − x₀)^k, k = 1..4, per coordinate (x₀ the first sample, which keeps the
    sums well conditioned), and their central second and fourth moments."""

    def __init__(self, first: np.ndarray) -> None:
        self.n = 0
        self.origin = first
        self.sums = [np.zeros_like(first) for _ in range(4)]

    def add(self, x: np.ndarray) -> None:
        d = x - self.origin
        power = d.copy()
        for k in range(4):
            self.sums[k] += power
            power = power * d
        self.n += 1

    def central(self) -> tuple[np.ndarray, np.ndarray]:
        """(Σ(x − x̄)², Σ(x − x̄)⁴) per coordinate."""
        s1, s2, s3, s4 = self.sums
        mean = s1 / self.n
        second = np.maximum(s2 - self.n * mean ** 2, 0.0)
        fourth = np.maximum(s4 - 4 * mean * s3 + 6 * mean ** 2 * s2 - 3 * self.n * mean ** 4,
                            0.0)
        return second, fourth


@dataclass
class RunRecord:
    """The release sample and the canary-free moments of one audit."""

    columns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    cells: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bare_cells: dict[int, Moments] = field(default_factory=dict)

    def choose(self, free: Sequence[np.ndarray], starts: Sequence[int], sizes: Sequence[int],
               rng: np.random.Generator) -> None:
        """Sample the kept coordinates from each tensor's ``free`` flat coordinates (all of
        them, before any subsampling), at offsets shared by every tensor."""
        share = max(2, min(RELEASE_COORDINATES, MAX_RELEASE_COORDINATES // max(len(sizes), 1)))
        keys = rng.random(max(sizes, default=0))
        kept = [np.sort(f[np.argsort(keys[f - start], kind="stable")[:share]])
                for f, start in zip(free, starts, strict=True)]
        self.columns = np.concatenate(kept).astype(np.int64) if kept else self.columns
        self.offsets = np.concatenate([k - start for k, start in zip(kept, starts, strict=True)]
                                      ).astype(np.int64) if kept else self.offsets
        self.groups = np.concatenate([np.full(k.size, g) for g, k in enumerate(kept)]
                                     ).astype(np.int64) if kept else self.groups

    def record(self, trial: int, trials: int, flat: np.ndarray, cell: int) -> None:
        """Keep release ``trial``'s values (of ``trials``) at the sample, in cell ``cell``."""
        if not self.columns.size:
            return
        if self.values.shape != (trials, self.columns.size):
            self.values = np.zeros((trials, self.columns.size))
            self.cells = np.zeros(trials, dtype=np.int64)
        self.values[trial] = flat[self.columns]
        self.cells[trial] = cell

    def record_bare(self, stratum: int, x: np.ndarray) -> None:
        """Add a canary-free release's noise coordinates to its stratum's moments."""
        if stratum not in self.bare_cells:
            self.bare_cells[stratum] = Moments(x.copy())
        self.bare_cells[stratum].add(x)

    def releases(self, trials: int, names: Sequence[str], std: float) -> Releases | None:
        """The first ``trials`` releases' sample, or None."""
        if not self.columns.size or self.values.shape[0] < trials or not std > 0:
            return None
        return Releases(self.values[:trials], self.cells[:trials], self.groups, tuple(names),
                        std, self.offsets)

    def bare_levels(self, names: Sequence[str], noise_group: np.ndarray,
                    std: float) -> NoiseLevels | None:
        """ν and Q per tensor of the canary-free releases' noise coordinates, or None."""
        if not self.bare_cells or not std > 0:
            return None
        dof, squares = np.zeros(len(names)), np.zeros(len(names))
        for cell in self.bare_cells.values():
            if cell.n >= 2:
                second, _ = cell.central()
                np.add.at(squares, noise_group, second / std ** 2)
                np.add.at(dof, noise_group, cell.n - 1)
        keep = dof > 0
        if not keep.any():
            return None
        return NoiseLevels(tuple(np.array(names)[keep].tolist()), dof[keep], squares[keep])
