"""The default's choice between the aware parts and the blind ones, by the update they explain.

With ``objective=auto`` and ``replay=auto``, when the published defenses make the aware parts
(:mod:`fedleak.attacks.optimisation.adaptive`) differ from the blind ones (cosine, plain), a
composed attack runs both from the same seed — the aware parts for ⌈T/2⌉ iterations, the blind ones
for ⌊T/2⌋ — and keeps the reconstruction that better explains the observed update under the
published mechanism (:func:`~fedleak.attacks.optimisation.explained.explain`): the lower discrepancy
``|log ρ|``, ρ the residual over the published noise (Morozov's discrepancy principle), or the log
of the residual without published noise. The aware one must win by more than the criterion's
sampling noise, √(2/d) for d coordinates (:func:`~fedleak.attacks.optimisation.explained.better`); a
tie goes to the blind one. No ground truth is used.

Several observations (:func:`select_many`): each variant is packed over the weighed ones, as
:meth:`~fedleak.attacks.optimisation.composed.ComposedInversion.recover_many` packs, and the others
are attacked packed at the full budget, so every observation gets what it gets alone, up to float
rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.engine.composed_config import ComposedConfig
from fedleak.attacks.optimisation.explained import better, explain, mechanism_replay
from fedleak.attacks.optimisation.restarts import alone


class WeighedAttack(Protocol):
    """What the weighing needs of a composed attack.

    The composed attack is :class:`~fedleak.attacks.optimisation.composed.ComposedInversion`.
    """

    @property
    def config(self) -> ComposedConfig:
        """The attack's settings (iterations T, restarts, seed offsets)."""

    def variants(self) -> Mapping[str, WeighedAttack]:
        """Return the aware attack (⌈T/2⌉ iterations) and the blind one (⌊T/2⌋)."""
        ...

    def recover(self, observation: Observation, *, device: torch.device, seed: int,
                progress: Progress | None) -> Reconstruction:
        """Reconstruct ``observation``'s images, reporting ``progress``."""

    def recover_many(self, targets: Sequence[Observation], *, device: torch.device,
                     seeds: Sequence[int], progress: Progress | None
                     ) -> list[Reconstruction]:
        """Reconstruct every one of ``targets``, packed where the replays allow it."""


def select(attack: WeighedAttack, observation: Observation, *, device: torch.device,
           seed: int, progress: Progress | None) -> Reconstruction:
    """Return the aware parts (⌈T/2⌉ iterations) and the blind ones (⌊T/2⌋), same seed.

    The reconstruction that better explains the observed update under the published mechanism wins
    (:func:`kept`), a tie going to the blind one.
    """
    cfg = attack.config
    runs: dict[str, Reconstruction] = {}
    offset = 0
    for name, clone in attack.variants().items():
        torch.manual_seed(seed)
        runs[name] = clone.recover(observation, device=device, seed=seed,
                                   progress=shifted(progress, offset,
                                                    cfg.iterations * cfg.restarts))
        offset += clone.config.iterations * clone.config.restarts
    return kept(observation, runs["aware"], runs["blind"], cfg.iterations)


def select_many(attack: WeighedAttack, targets: Sequence[Observation],
                weighing: Sequence[bool], *, device: torch.device, seeds: Sequence[int],
                progress: Progress | None) -> list[Reconstruction]:
    """Run :func:`select` on the ``weighing`` targets and attack the others packed.

    :func:`select` for the ``weighing`` targets, each variant packed over them, the others attacked
    packed at the full budget (module docstring).
    """
    cfg = attack.config
    results: list[Reconstruction | None] = [None] * len(targets)
    plain = [i for i, w in enumerate(weighing) if not w]
    if plain:
        for i, r in zip(plain, attack.recover_many(
                [targets[i] for i in plain], device=device, seeds=[seeds[i] for i in plain],
                progress=progress), strict=True):
            results[i] = r
    chosen = [i for i, w in enumerate(weighing) if w]
    runs: dict[str, list[Reconstruction]] = {}
    offset = 0
    for name, clone in attack.variants().items():
        runs[name] = clone.recover_many([targets[i] for i in chosen], device=device,
                                        seeds=[seeds[i] for i in chosen],
                                        progress=shifted(progress, offset,
                                                         cfg.iterations * cfg.restarts))
        offset += clone.config.iterations * clone.config.restarts * len(chosen)
    for k, i in enumerate(chosen):
        results[i] = kept(targets[i], runs["aware"][k], runs["blind"][k], cfg.iterations)
    return [r for r in results if r is not None]


def kept(observation: Observation, aware: Reconstruction, blind: Reconstruction,
         iterations: int) -> Reconstruction:
    """Choose the variant's reconstruction that explains the update better.

    Of the two variants' reconstructions of ``observation`` (``iterations`` T in all), the one that
    explains the update better (by more than the criterion's noise, else the blind one), recording
    which and why.
    """
    judge = mechanism_replay(alone(observation), observation)
    judged = {"aware": explain(observation, aware.images, aware.labels, judge),
              "blind": explain(observation, blind.images, blind.labels, judge)}
    chosen = "aware" if better(judged["aware"], judged["blind"]) else "blind"
    result, other = (aware, blind) if chosen == "aware" else (blind, aware)
    result.iterations = aware.iterations + blind.iterations
    rule = "|log ρ| (ρ: residual over the published noise, Morozov's discrepancy " \
        "principle)" if judged["aware"].noise_ratio is not None else \
        "log of the residual of the observed update under the published mechanism"
    rule += f", by more than √(2/d) = {math.sqrt(2 / judged['aware'].coordinates):.3g}"
    half = iterations // 2
    reasons = [str(r) for r in aware.extras.get("part_reasons", [])]
    result.extras.update(
        selected=chosen, aware_discrepancy=judged["aware"].discrepancy(),
        blind_discrepancy=judged["blind"].discrepancy(),
        part_reasons=[*reasons, f"default auto: the aware parts and the blind ones "
                      f"(cosine, plain), {iterations - half} + {half} iterations; kept "
                      f"the {chosen} reconstruction, which explains the update better by "
                      f"{rule}: aware {judged['aware'].discrepancy():.6g}, blind "
                      f"{judged['blind'].discrepancy():.6g}"])
    result.warnings = sorted({*result.warnings, *other.warnings})
    return result


def shifted(progress: Progress | None, offset: int, grand: int) -> Progress | None:
    """Report ``progress`` of one variant within the whole attack's count.

    ``progress`` of one variant, counted on from ``offset`` out of ``grand`` (the attack's
    iterations × restarts).
    """
    if progress is None:
        return None

    def report(done: int, total: int, value: float) -> None:
        progress(offset + done, grand, value)

    return report
