"""Canaries that cover the whole declared mechanism, and the victim's measurement of them.

One canary at one coordinate tests one coordinate: noise missing from a tensor it does not
touch, or a clip of the wrong geometry, passes. An audit with coverage (the default) adds,
besides the primary canary the server scores, canaries over every parameter tensor and the
claimed geometry, each with its own secret coin:

- **per-example mechanisms** (one extra example per canary, each clipped on its own, so they
  do not interfere): ``per_group`` Dirac canaries in every tensor, on the coordinates a public
  synthetic batch moves least, and ``spread`` canaries that each put one coordinate in every
  tensor (a total-norm clip bounds them as a whole, a per-tensor clip would not);
- **the update stage** (the canary is added to the update, so several would share one clip):
  the primary canary itself spreads over one quiet coordinate per tensor, and it is read both
  per tensor and as a whole.

Each *stream* is the released update (or secure-aggregation sum) projected on one canary's
unit direction, computed by the victim from what it released — the number the server could
compute, but exact and linear whatever the server submits. Beside it the victim keeps what the
declaration says the stream should do: the canary's mean shift and its variance (Poisson), and
the noise's std, from the declared clip applied to the canary (per example) or to the update
with and without it (update stage: :meth:`~fedleak.defenses.composition.UpdateComposition.
declared_map`), scaled by the local steps' weights in the released update
(:mod:`~fedleak.harness.victim.audit.steps`). :meth:`Coverage.table` hands all of it to the
declaration tests (:mod:`fedleak.auditing.estimators.declared_mechanism`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedleak.auditing.estimators.declared_mechanism import SPREAD
from fedleak.auditing.estimators.noise_level import NoiseLevels
from fedleak.auditing.estimators.noise_ratio import StreamTable
from fedleak.defenses.composition import UpdateComposition
from fedleak.defenses.mechanism import Mechanism
from fedleak.harness.victim.audit.run_record import Moments, RunRecord
from fedleak.harness.victim.audit.steps import StepPlan

#: Default canaries per tensor (per-example) and spread canaries.
PER_GROUP = 16
SPREAD_CANARIES = 8
#: The canaries' rows may hold at most this many values (rows × parameters).
MAX_CANARY_VALUES = 1 << 24
#: Coordinates per tensor whose spread the noise-level test reads (a seeded subset beyond it).
NOISE_COORDINATES = 4096
#: the key of the accumulators over every stratum together
POOLED_STRATUM = -1


@dataclass
class Stream:
    """One canary's unit direction (sparse: coordinates of the flat update, and weights)."""

    canary: int
    group: str
    coordinates: np.ndarray
    weights: np.ndarray
    declared_shift: float = 0.0
    declared_std: float = 1.0
    shift_variance: float = 0.0
    #: whether its canary-out trials feed the noise-level test (streams sharing coordinates
    #: with others do not: their noise would count twice)
    noise_sample: bool = True


@dataclass
class Coverage:
    """The audit's canaries beyond (or around) the primary one, and what the victim measured."""

    #: each canary as (flat coordinates, values) — its vector c, norm included
    canaries: list[tuple[np.ndarray, np.ndarray]]
    streams: list[Stream]
    per_example: bool
    coins: np.ndarray            # [trials, canaries]; column 0 is the primary canary's coin
    sign: float = 1.0
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    strata: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    #: update stage: the declared shift of every stream summed over the trials that ran
    shift_sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    shift_count: int = 0
    uncovered: list[str] = field(default_factory=list)
    #: the noise-level test: coordinates away from the canaries, their group, declared std
    noise_coordinates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    noise_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    group_names: list[str] = field(default_factory=list)
    noise_std: float = 0.0
    #: cells by (stratum, primary coin): the moments of every noise coordinate
    cells: dict[tuple[int, bool], Moments] = field(default_factory=dict)
    by_coin: bool = False
    #: strata of the streams split by the primary canary's coin too (an input canary)
    coin_strata: bool = False
    #: the canary-free phase: trials with no canary at all (not scored), and their cells
    bare: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: every release's values at a sample of coordinates, and the canary-free moments
    run: RunRecord = field(default_factory=RunRecord)
    #: the declared std the release sample is read against where the noise level is not
    release_std: float = 0.0

    def __post_init__(self) -> None:
        trials = self.coins.shape[0]
        self.values = np.zeros((trials, len(self.streams)))
        self.strata = np.zeros(trials, dtype=np.int64)
        self.shift_sums = np.zeros(len(self.streams))
        self.bare = np.zeros(trials, dtype=bool)

    def keep_trials(self, trials: int) -> None:
        """Keep the first ``trials`` trials' rows (the session's count)."""
        self.coins = self.coins[:trials]
        self.values = self.values[:trials]
        self.strata = self.strata[:trials]
        self.bare = self.bare[:trials]

    def canary_free(self, count: int, rng: np.random.Generator) -> None:
        """Make ``count`` trials at secret positions canary-free (every coin out)."""
        trials = self.coins.shape[0]
        if count <= 0 or trials == 0:
            return
        chosen = rng.choice(trials, min(count, trials), replace=False)
        self.coins[chosen] = False
        self.bare[chosen] = True

    def watch_noise(self, names: Sequence[str], sizes: Sequence[int], std: float,
                    rng: np.random.Generator) -> None:
        """Read the spread of up to NOISE_COORDINATES coordinates per tensor that no canary
        touches (their declared noise std ``std``)."""
        used = np.unique(np.concatenate([c for c, _ in self.canaries]))
        coords, groups, frees, starts, start = [], [], [], [], 0
        for g, size in enumerate(sizes):
            free = np.setdiff1d(np.arange(start, start + size), used, assume_unique=True)
            frees.append(free)
            starts.append(start)
            if free.size > NOISE_COORDINATES:
                free = np.sort(rng.choice(free, NOISE_COORDINATES, replace=False))
            coords.append(free)
            groups.append(np.full(free.size, g))
            start += size
        self.noise_coordinates = np.concatenate(coords).astype(np.int64)
        self.noise_group = np.concatenate(groups).astype(np.int64)
        self.group_names = list(names)
        self.noise_std = std
        self.run.choose(frees, starts, sizes, rng)

    def watch_releases(self, names: Sequence[str], sizes: Sequence[int], std: float,
                       rng: np.random.Generator) -> None:
        """Keep every release at sampled coordinates away from the canaries without reading
        the noise level (a box clip near the noise biases its spread, not the releases'
        independence, which the lag and correlation tests read scale-free)."""
        used = np.unique(np.concatenate([c for c, _ in self.canaries]))
        frees, starts, start = [], [], 0
        for size in sizes:
            frees.append(np.setdiff1d(np.arange(start, start + size), used, assume_unique=True))
            starts.append(start)
            start += size
        self.group_names = list(names)
        self.release_std = std
        self.run.choose(frees, starts, sizes, rng)

    def rows(self, trial: int, shapes: Sequence[Sequence[int]], dtype: torch.dtype,
             device: torch.device) -> list[torch.Tensor] | None:
        """The in-canaries of ``trial`` as per-example rows [K_in, *θ_l.shape] per parameter."""
        chosen = np.array([k for k in np.flatnonzero(self.coins[trial])
                           if self.canaries[k][0].size], dtype=np.int64)
        if chosen.size == 0:
            return None
        total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        flat = torch.zeros((chosen.size, total), dtype=torch.float64)
        for row, k in enumerate(chosen):
            coords, values = self.canaries[k]
            flat[row, torch.from_numpy(coords)] = torch.from_numpy(values)
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(flat[:, start:start + size].reshape(chosen.size, *shape)
                       .to(dtype=dtype, device=device))
            start += size
        return out

    def record(self, trial: int, released: torch.Tensor, stratum: int) -> None:
        """Project trial ``trial``'s released update (flat) on every stream."""
        flat = released.detach().double().cpu().numpy()
        for s, stream in enumerate(self.streams):
            self.values[trial, s] = self.sign * float(flat[stream.coordinates] @ stream.weights)
        if self.coin_strata:  # the primary canary moves every stream: hold its coin fixed
            stratum = 2 * stratum + int(self.coins[trial, 0])
        self.strata[trial] = stratum
        coin = bool(self.coins[trial, 0]) if self.by_coin else False
        bare = bool(self.bare[trial])
        self.run.record(trial, self.coins.shape[0], flat,
                        (2 * stratum + int(coin)) * 2 + int(bare))
        if self.noise_coordinates.size:
            x = flat[self.noise_coordinates]
            keys = [(stratum, coin), (POOLED_STRATUM, coin)] if not bare else []
            for key in keys:
                if key not in self.cells:
                    self.cells[key] = Moments(x.copy())
                self.cells[key].add(x)
            if bare:
                self.run.record_bare(stratum, x)

    def noise_levels(self, trials: int, main: np.ndarray | None = None) -> NoiseLevels | None:
        """ν and Q per tensor (:mod:`fedleak.auditing.estimators.noise_level`) from the coordinates
        away from the canaries and from every stream's canary-out trials, or None."""
        if not self.noise_std > 0 or not (self.noise_coordinates.size or self.streams):
            return None
        names = list(dict.fromkeys([*self.group_names,
                                    *(s.group for s in self.streams if s.noise_sample)]))
        index = {n: i for i, n in enumerate(names)}
        dof, squares = np.zeros(len(names)), np.zeros(len(names))
        groups = np.array([index[self.group_names[g]] for g in self.noise_group], dtype=int)
        stratified = {k: v for k, v in self.cells.items() if k[0] != POOLED_STRATUM}
        pooled = {k: v for k, v in self.cells.items() if k[0] == POOLED_STRATUM}
        usable = sum(c.n - 1 for c in stratified.values() if c.n >= 2)
        total = sum(c.n - 1 for c in pooled.values() if c.n >= 2)
        chosen = stratified if usable * 2 >= total else pooled  # batches that rarely repeat
        strata = self.strata[:trials] if chosen is stratified else np.zeros(trials, np.int64)
        fourth = count = 0.0
        for cell in chosen.values():
            if cell.n >= 2:
                second, fourth_moment = cell.central()
                np.add.at(squares, groups, second / self.noise_std ** 2)
                np.add.at(dof, groups, cell.n - 1)
                fourth += float(fourth_moment.sum()) / self.noise_std ** 4
                count += cell.n * second.size
        coordinate_dof, coordinate_squares = float(dof.sum()), float(squares.sum())
        coins = self.coins[:trials]
        scored = np.ones(trials, dtype=bool) if main is None else main
        for k, stream in enumerate(self.streams):
            if not stream.noise_sample:
                continue
            out = ~coins[:, stream.canary] & scored
            for h in np.unique(strata[out]):
                rows = out & (strata == h)
                if self.by_coin:
                    rows &= ~coins[:, 0]
                y = self.values[:trials, k][rows] / stream.declared_std
                if y.size >= 2:
                    squares[index[stream.group]] += float(((y - y.mean()) ** 2).sum())
                    dof[index[stream.group]] += y.size - 1
        keep = dof > 0
        return NoiseLevels(tuple(np.array(names)[keep].tolist()), dof[keep], squares[keep],
                           coordinate_dof=coordinate_dof,
                           coordinate_squares=coordinate_squares,
                           coordinate_fourth=fourth, coordinate_count=count)

    def observe_update(self, composition: UpdateComposition, update: Sequence[torch.Tensor],
                       names: Sequence[str], coin: bool) -> None:
        """Update stage: from the update entering the chain (the canary added when ``coin``),
        add each stream's declared shift ⟨D(Δ + c) − D(Δ), u⟩ (D the declared clips)."""
        flat = torch.cat([u.detach().double().flatten() for u in update])
        coords, values = self.canaries[0]
        canary = torch.zeros_like(flat)
        canary[torch.from_numpy(coords)] = torch.from_numpy(values)
        clean = flat - canary if coin else flat
        shapes = [tuple(u.shape) for u in update]
        d_in = _flat(composition.declared_map(_split(clean + canary, shapes), names))
        d_out = _flat(composition.declared_map(_split(clean, shapes), names))
        moved = (d_in - d_out).numpy()
        for s, stream in enumerate(self.streams):
            self.shift_sums[s] += float(moved[stream.coordinates] @ stream.weights)
        self.shift_count += 1

    #: one local step per trial (FedSGD): the canaries' contributions add exactly
    one_step: bool = False
    #: the declared model gives every stream's law exactly (see StreamTable.exact)
    exact: bool = False

    def table(self, trials: int) -> StreamTable:
        """The measured streams of the first ``trials`` trials (the scored ones: the
        canary-free phase apart), with their declared values, the noise levels of both, and
        every release's sampled coordinates."""
        shifts = np.array([s.declared_shift for s in self.streams])
        if not self.per_example and self.shift_count:
            shifts = self.shift_sums / self.shift_count
        main = ~self.bare[:trials]
        return StreamTable(
            values=self.values[:trials][main],
            coins=self.coins[:trials][main][:, [s.canary for s in self.streams]],
            groups=tuple(s.group for s in self.streams), declared_shift=shifts,
            declared_std=np.array([s.declared_std for s in self.streams]),
            shift_variance=np.array([s.shift_variance for s in self.streams]),
            strata=self.strata[:trials][main], noise=self.noise_levels(trials, main),
            independent=self.per_example and self.one_step, exact=self.exact,
            releases=self.run.releases(trials, self.group_names,
                                       self.noise_std or self.release_std),
            bare_noise=self.run.bare_levels(self.group_names, self.noise_group,
                                            self.noise_std),
            bare_releases=int((~main).sum()))


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def _split(flat: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    out, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        out.append(flat[start:start + size].reshape(shape))
        start += size
    return out


def quiet_order(quietness: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Per tensor, its flat coordinates from the quietest (smallest |g| on public data) up."""
    out, start = [], 0
    for size in sizes:
        out.append(start + np.argsort(quietness[start:start + size], kind="stable"))
        start += size
    return out


def per_example_coverage(primary: tuple[np.ndarray, np.ndarray] | None, names: Sequence[str],
                         sizes: Sequence[int], quietness: np.ndarray, mechanism: Mechanism,
                         plan: StepPlan, canary_norm: float, trials: int,
                         rng: np.random.Generator, per_group: int = PER_GROUP,
                         spread: int = SPREAD_CANARIES) -> Coverage:
    """Dirac canaries per tensor and spread canaries, beside the ``primary`` canary (None: an
    input canary, which enters as an image and is no stream here; coin column 0 stays its)."""
    total = sum(sizes)
    budget = max(0, MAX_CANARY_VALUES // max(total, 1) - 1)
    empty = (np.zeros(0, np.int64), np.zeros(0))
    used = set(primary[0].tolist()) if primary is not None else set()
    order = [[int(j) for j in o if int(j) not in used] for o in quiet_order(quietness, sizes)]
    spread = min(spread, budget // 2, max(len(o) for o in order) if order else 0)
    per_group = min(per_group, max(0, (budget - spread) // max(len(sizes), 1)))
    canaries = [primary if primary is not None else empty]
    groups = [_group_of(int(primary[0][0]), names, sizes) if primary is not None else ""]
    uncovered = []
    for _ in range(spread):  # one coordinate in every tensor that has one left
        coords = np.array([o.pop(0) for o in order if o], dtype=np.int64)
        canaries.append((coords, np.full(coords.size, canary_norm / math.sqrt(coords.size))))
        groups.append(SPREAD)
    for name, o in zip(names, order, strict=True):
        take = min(per_group, len(o))
        if take == 0:
            uncovered.append(f"{name} (no coordinate left for a canary)")
        for j in o[:take]:
            canaries.append((np.array([j], dtype=np.int64), np.array([canary_norm])))
            groups.append(name)
    clip = mechanism.clip
    std = mechanism.noise.std if mechanism.noise is not None else 0.0
    streams = []
    for k, ((coords, values), group) in enumerate(zip(canaries, groups, strict=True)):
        if not coords.size:
            continue
        unit = values / np.linalg.norm(values)
        clipped = declared_clip(coords, values, clip, names, sizes)
        mean, variance = plan.shift(float(clipped @ unit) / plan.batch)
        streams.append(Stream(k, group, coords, unit, mean, plan.noise(std) or 1e-300,
                              variance))
    coins = rng.random((trials, len(canaries))) < 0.5
    return Coverage(canaries, streams, True, coins, uncovered=uncovered)


def update_coverage(canary: tuple[np.ndarray, np.ndarray], names: Sequence[str],
                    sizes: Sequence[int], noise_std: float, coins: np.ndarray) -> Coverage:
    """The update stage's one canary read per tensor and as a whole (its declared shifts are
    added trial by trial, :meth:`Coverage.observe_update`)."""
    coords, values = canary
    streams = [Stream(0, SPREAD, coords, values / np.linalg.norm(values),
                      noise_sample=False)]
    for j in coords.tolist():
        streams.append(Stream(0, _group_of(j, names, sizes), np.array([j]), np.array([1.0])))
    for s in streams:
        s.declared_std = noise_std or 1e-300
    return Coverage([canary], streams, False, coins[:, None])


def _group_of(coordinate: int, names: Sequence[str], sizes: Sequence[int]) -> str:
    start = 0
    for name, size in zip(names, sizes, strict=True):
        if coordinate < start + size:
            return name
        start += size
    raise ValueError(f"coordinate {coordinate} lies outside the {start} parameters")


def declared_clip(coords: np.ndarray, values: np.ndarray, clip: object,
                   names: Sequence[str], sizes: Sequence[int]) -> np.ndarray:
    """The declared per-example clip of one canary, at its coordinates."""
    from fedleak.defenses.mechanism import Clip

    if not isinstance(clip, Clip):  # no declared clip: the canary passes as it is
        return values
    flat = torch.zeros(sum(sizes), dtype=torch.float64)
    flat[torch.from_numpy(coords)] = torch.from_numpy(values)
    parts = _split(flat, [(s,) for s in sizes])
    clipped = _flat(clip.apply(parts, names)).numpy()
    return np.asarray(clipped[coords])
