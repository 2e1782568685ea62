"""An audit's plan on the victim: its coverage canaries, the trials its power needs, what each
trial adds to the user's computation, and the verdict from what the victim measured.

At ``BeginAudit`` the victim builds the coverage (:mod:`~fedleak.harness.victim.
audit_coverage`) from the declarations, and — when the server asks for no trial count — picks
the trials at which the declaration tests would catch noise ``detect_shortfall``·σ with the
stated power, from the declared model alone (:func:`fedleak.auditing.estimators.noise_ratio.
trials_for_power`), capped by its limits. Each trial then runs the user's update with the
in-canaries of that trial and the victim projects what it released on every stream. The
answer runs every registered estimator (:func:`fedleak.auditing.verdict.evaluate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedleak.auditing.estimator_registry import Game, GameSettings
from fedleak.auditing.estimators.declared_mechanism import SPREAD
from fedleak.auditing.estimators.noise_ratio import declared_cells, trials_for_power
from fedleak.auditing.verdict import Evaluation, evaluate
from fedleak.defenses import DefenseChain
from fedleak.defenses.composition import trial_noise_std
from fedleak.defenses.mechanism import PER_COORDINATE
from fedleak.harness.federated.private_update import TrialCanary
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.audit.canary import AuditCanary, default_norm
from fedleak.harness.victim.audit.claim import TrialClaim
from fedleak.harness.victim.audit.coverage import (
    Coverage,
    per_example_coverage,
    update_coverage,
)
from fedleak.harness.victim.audit.request import DEFAULT_TRIALS, AuditRequest
from fedleak.harness.victim.audit.steps import step_plan

#: tests of the primary scores besides the coverage's (Clopper–Pearson, Gaussian-DP, one-run,
#: the subsampled route or the sampling check): their share of the false-alarm rate
PRIMARY_TESTS = 4


def plan_coverage(request: AuditRequest, canary: AuditCanary, chain: DefenseChain,
                  names: Sequence[str], sizes: Sequence[int], protocol: Protocol,
                  num_images: int, noise_users: int, trials: int,
                  rng: np.random.Generator) -> Coverage | None:
    """The coverage of this audit, or None (coverage off, an input or random canary, or a
    chain that declares no Gaussian mechanism for the canary)."""
    if not request.coverage or canary.quietness is None:
        return None
    image = canary.kind == "input"
    if canary.sparse is None and not (image and chain.per_example is not None):
        return None  # a random direction, or an input canary of the update stage
    coins = rng.random(trials) < 0.5
    if chain.per_example is not None and request.canary != "client":
        mechanism = chain.per_example_mechanism
        if mechanism is None or not mechanism.gaussian:
            return None
        plan = step_plan(protocol, num_images,
                         mechanism.sampling.poisson_rate(num_images, protocol.batch_size))
        norm = canary.norm or default_norm(chain, per_example=True)
        coverage = per_example_coverage(canary.sparse, names, sizes, canary.quietness,
                                         mechanism, plan, norm, trials, rng)
        coverage.coins[:, 0] = coins
        coverage.sign = canary.score_sign
        coverage.by_coin = coverage.coin_strata = image  # its gradient reaches every coordinate
        coverage.one_step = plan.weights.size == 1
        coverage.exact = coverage.one_step and plan.sample_rate is None
        std = plan.noise(mechanism.noise.std if mechanism.noise is not None else 0.0)
        _watch(coverage, chain, names, sizes, std, rng)
        return coverage
    composition = chain.update_composition()
    if not composition.gaussian or canary.sparse is None:
        return None
    std = trial_noise_std(composition, noise_users)
    coverage = update_coverage(canary.sparse, names, sizes, std, coins)
    coverage.by_coin = True  # a clip rescales every coordinate with the canary's coin
    coverage.exact = not protocol.order_matters(num_images)  # no secret order moves the data
    _watch(coverage, chain, names, sizes, std, rng)
    return coverage


def _watch(coverage: Coverage, chain: DefenseChain, names: Sequence[str],
           sizes: Sequence[int], std: float, rng: np.random.Generator) -> None:
    """Read the noise level unless a declared box clip after the noise would bias it (a clip
    within six noise stds of zero cuts the noise's tails and shrinks its spread)."""
    transport = chain.transport_mechanism
    box = transport.clip if transport is not None else None
    if box is not None and box.geometry == PER_COORDINATE and box.norm < 6 * std:
        coverage.uncovered.append(f"the noise level (the transport's ±{box.norm:g} box clip "
                                  f"is within 6 noise stds, {std:.3g})")
        coverage.watch_releases(names, sizes, std, rng)
        return
    coverage.watch_noise(names, sizes, std, rng)


def choose_trials(request: AuditRequest, coverage: Coverage | None, claim: TrialClaim,
                  max_trials: int, nominal_shift: float) -> int:
    """The trials asked for, or those at which the whole-mechanism test catches noise
    ``detect_shortfall``·σ with the requested power under the declared model (module
    docstring); ``nominal_shift`` is an update-stage canary's public shift (its shift for
    this user's data is measured during the trials)."""
    if request.trials:
        return request.trials
    if coverage is None or not claim.claims:
        return min(DEFAULT_TRIALS, max_trials)
    streams = coverage.streams
    if coverage.per_example:
        target = [s for s in streams if s.group != SPREAD]
        shifts = np.array([s.declared_shift for s in target])
    else:
        target = [s for s in streams if s.group == SPREAD]
        shifts = np.full(len(target), nominal_shift)
    rho = shifts / np.array([s.declared_std for s in target])
    variance = np.array([s.shift_variance / s.declared_std ** 2 for s in target])
    groups = len(set(s.group for s in streams)) + 1
    level = request.false_alarm / (groups + PRIMARY_TESTS)
    cells = declared_cells(rho, variance, trials=1000)
    return max(4, trials_for_power(cells, 1000, level, request.detect_shortfall,
                                   request.power, request.max_chosen_trials))


def trial_canary(canary: AuditCanary, coverage: Coverage | None, base: TrialCanary,
                 coin: bool, trial: int, parameters: dict[str, torch.Tensor]) \
        -> TrialCanary | None:
    """What trial ``trial`` adds to the user's computation: every in-canary of a per-example
    coverage as rows, else the one canary when its coin is in."""
    if coverage is not None and coverage.per_example:
        first = next(iter(parameters.values()))
        rows = coverage.rows(trial, [tuple(p.shape) for p in parameters.values()],
                             first.dtype, first.device)
        image = base.image is not None and coin  # an input canary joins as an image
        if rows is None and not image:
            return None
        return TrialCanary(rows=rows, image=base.image if image else None,
                           label=base.label if image else None)
    return base if coin else None


def verdict_game(scores: np.ndarray, coins: np.ndarray, calibration: np.ndarray,
                 settings: GameSettings, threshold: float | None, claim: TrialClaim,
                 coverage: Coverage | None, request: AuditRequest,
                 released: int | None = None) -> Evaluation:
    """Every estimator on the primary scores and the measured streams (``released``: the
    trials run, the canary-free phase's included; default: one per score)."""
    streams = coverage.table(released or scores.size) if coverage is not None else None
    game = Game(scores, coins, calibration, settings, threshold, claim=claim,
                streams=streams, false_alarm=request.false_alarm, power=request.power)
    return evaluate(game)


def stratum(indices: torch.Tensor) -> int:
    """A key of the private batch a trial trained on (its data's offset is the same)."""
    values = indices.detach().cpu().flatten().tolist()
    return hash(tuple(int(v) for v in values)) & 0x7FFFFFFF


def covered_groups(coverage: Coverage | None) -> str:
    """What the coverage probed, in words."""
    if coverage is None:
        return "the primary canary alone"
    groups = list(dict.fromkeys(s.group for s in coverage.streams))
    text = (f"{len(coverage.canaries)} canaries over {len(groups)} groups "
            f"({', '.join(groups[:6])}{', …' if len(groups) > 6 else ''})")
    if coverage.noise_coordinates.size:
        text += (f"; the noise level read on {coverage.noise_coordinates.size} coordinates of "
                 f"{len(coverage.group_names)} tensors")
    bare = int(coverage.bare.sum())
    if bare:
        text += (f"; {bare} of the trials canary-free (the user's batch alone, not scored: "
                 "the noise level against the declared scale)")
    if coverage.uncovered:
        text += f"; not covered: {', '.join(coverage.uncovered)}"
    return text


def finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0
