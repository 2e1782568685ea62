"""A run of releases, as the tests across releases and coordinates read it.

The released
values of a sample of coordinates away from every canary, in the order the victim released
them, with each release's cell.

A *cell* holds the releases whose data part is the same: one stratum of the victim's batches
(and, for the update stage or an input canary, one value of the primary canary's coin, and the
canary-free phase apart). Within a cell c of n_c releases the declared mechanism makes
x_t = μ_c + n_t with the noise n_t fresh N(0, s²I) in every release: independent across
releases *and* across coordinates. The tests work on the residuals e = P x, P the projection
that removes each cell's mean (rank r = T − #cells), whose law under the declaration is known
exactly: for any fixed matrix A, E[eᵀAe / eᵀe] = tr(PA) / r (the ratio is independent of
‖e‖, Pitman–Koopman), and for two independent coordinates the correlation of their residuals
is that of two independent samples of r values (t-distributed with r − 1 degrees of freedom).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Releases:
    """Per release (rows, in release order) the values of sampled coordinates (columns)."""

    values: np.ndarray            # [T, m]
    cells: np.ndarray             # [T] int: the release's cell
    column_groups: np.ndarray     # [m] int: the parameter tensor of each column
    group_names: tuple[str, ...]  # names of the groups indexed by column_groups
    declared_std: float           # s: the declared noise std of one coordinate
    #: [m] each column's flat offset within its tensor (tensors sampled at shared offsets,
    #: so noise copied from one tensor to another meets itself), or None
    column_offsets: np.ndarray | None = None

    def __post_init__(self) -> None:
        """Check the shapes agree."""
        t, m = self.values.shape
        if self.cells.shape != (t,) or self.column_groups.shape != (m,) or \
                (self.column_offsets is not None and self.column_offsets.shape != (m,)):
            raise ValueError("release values, cells and column groups disagree in shape")

    @property
    def trials(self) -> int:
        """Return T, the number of releases."""
        return int(self.values.shape[0])

    @property
    def rank(self) -> int:
        """R = T − #cells: the residuals' degrees of freedom per coordinate."""
        return self.trials - int(np.unique(self.cells).size)

    def residuals(self) -> np.ndarray:
        """E = P x: every column with its cell means removed."""
        out = self.values.astype(np.float64, copy=True)
        for cell in np.unique(self.cells):
            rows = self.cells == cell
            out[rows] -= out[rows].mean(axis=0)
        return out

    def columns(self, group: int | None) -> np.ndarray:
        """Return the columns of one group (None: every column)."""
        if group is None:
            return np.arange(self.values.shape[1])
        return np.flatnonzero(self.column_groups == group)

    def cell_sizes(self) -> np.ndarray:
        """n_c of every release's cell."""
        _, inverse, counts = np.unique(self.cells, return_inverse=True, return_counts=True)
        return counts[inverse]
