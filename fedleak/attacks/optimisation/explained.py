"""How well a reconstruction explains the observed update, under the published mechanism.

Choosing between two reconstructions of one observation without ground truth: the better one
is the one under which what the server received is the more likely. The published defense
chain (Kerckhoffs) is the mechanism M that turned the user's update u(x*) into the observed
u*; for a candidate x the residual of the observation is

    r(x) = u* − M̄(u(x)),        M̄ = the chain's deterministic part, in order:

- ``clip``: u ↦ u · min(1, C / ‖u‖) (all parameters together);
- ``dpsgd`` (FedSGD, no Poisson sampling): the replay clips each image's gradient to C before
  averaging (:class:`~fedleak.attacks.optimisation.replays.ClippedReplay`; for one image a scale);
- ``noise``, ``quantize`` and DP-SGD's noise add zero-mean noise of known variance σ_l² per
  coordinate (:func:`~fedleak.attacks.optimisation.published_noise.noise_variances`),

and the negative log-likelihood of u* given x, up to constants, is the weighted residual

    E(x) = Σ_l ‖r_l(x)‖² / v_l,     v_l = σ_l² where noise is published, else 1.

``prune`` keeps the entries of largest magnitude and zeroes the rest: what u* says is the
kept values (M = 1[u* ≠ 0]) and that every zeroed entry of the user's update was no larger
than the smallest kept one, t_l (per layer, or over the whole update for ``scope=global``). Its
residual is the violation of both,

    E(x) = Σ_l ‖M_l ⊙ (u*_l − u_l(x))‖² + ‖(1 − M_l) ⊙ max(abs(u_l(x)) − t_l, 0)‖²,

rather than the distance to the candidate's own top entries, whose support jumps with any
small error below the threshold. Which candidate explains u* better (:func:`better`):

- where the chain adds noise of known variance (``noise``, ``dpsgd``), a smaller residual is
  not better: the true image leaves a residual of pure noise, E(x*) ≈ d (d coordinates), and a
  candidate with E < d has fitted the noise. By Morozov's discrepancy principle (the choice of
  regularisation for inverse problems with a known noise level) the better candidate is the
  one whose residual is closest to the noise, ρ = E/d closest to 1 (``|log ρ|`` smallest);
- otherwise (``prune``, ``clip``, ``quantize``: deterministic, or unbiased rounding) the
  smaller E, the maximum-likelihood choice.

Both are compared on a log scale, D = ``|log ρ|`` or log E, and the aware candidate must win by
more than the criterion's own sampling noise: a residual of d coordinates' independent noise
fluctuates by a relative √(2/d) (a χ² with d degrees of freedom), so the aware candidate is
kept only when D_aware < D_blind − √(2/d); otherwise (a tie, or a difference the noise could
make) the blind one is. The composed attacks' default
``objective=auto`` / ``replay=auto`` reconstructs with the defense-aware parts *and* with the
blind ones and keeps the better (:mod:`fedleak.attacks.optimisation.adaptive`); the labels are the
attack's recovered ones for both. Nothing here reads the private images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.optimisation.published_noise import additive_variance, noise_variances
from fedleak.attacks.optimisation.replays import create_replay
from fedleak.attacks.parts import PartError
from fedleak.attacks.published import PublishedDefense
from fedleak.attacks.replay_contract import RestartsUpdateFn


@dataclass(frozen=True)
class Explanation:
    """How well one candidate explains u*: E, and ρ = E/d where noise is published."""

    residual: float
    noise_ratio: float | None
    #: d, the number of coordinates of the update
    coordinates: int = 1

    def discrepancy(self) -> float:
        """Return what :func:`better` minimises: ``|log ρ|`` with published noise, else log E."""
        if self.noise_ratio is None:
            return math.log(max(self.residual, 1e-300))
        return abs(math.log(max(self.noise_ratio, 1e-300)))


def explain(observation: Observation, images: torch.Tensor, labels: torch.Tensor,
            replay: RestartsUpdateFn) -> Explanation:
    """Return E(x) (and ρ) of the module docstring for ``images``.

    E(x) (and ρ) of the module docstring for ``images`` [n, C, H, W] (normalised space) with
    ``labels``, replayed by ``replay`` (restart form: the mechanism's replay).
    """
    observed = [u.detach() for u in observation.update]
    with torch.enable_grad():  # the replay differentiates the loss (no graph to the images)
        update = [u[0].detach() for u in replay(images.detach().unsqueeze(0), labels)]
    pruned = None
    for defense in observation.defenses:
        if defense.name == "prune":
            pruned = defense
            break  # its residual is the kept values and the threshold (module docstring)
        update = deterministic_part(defense, update)
    variances = noise_variances(observed, observation, per_row=False)
    thresholds = pruning_thresholds(observed, pruned) if pruned is not None else None
    total = 0.0
    for index, (o, u, v) in enumerate(zip(observed, update, variances, strict=True)):
        weight = float(v) if float(v) > 0 else 1.0
        o, u = o.double(), u.double()
        if thresholds is None:
            total += float((o - u).square().sum()) / weight
            continue
        kept = o != 0
        above = (u.abs() - thresholds[index]).clamp(min=0)
        total += (float((o - u)[kept].square().sum()) +
                  float(above[~kept].square().sum())) / weight
    noisy = additive_variance(observation) > 0
    count = sum(o.numel() for o in observed)
    return Explanation(total, total / count if noisy else None, count)


def better(aware: Explanation, blind: Explanation) -> bool:
    """Tell whether the aware candidate explains u* better than the blind one.

    Whether the aware candidate explains u* better than the blind one by more than the criterion's
    sampling noise √(2/d) (module docstring); a tie or less: no.
    """
    margin = math.sqrt(2 / max(min(aware.coordinates, blind.coordinates), 1))
    return aware.discrepancy() < blind.discrepancy() - margin


def deterministic_part(defense: PublishedDefense, update: Sequence[torch.Tensor]
                       ) -> list[torch.Tensor]:
    """Return what ``defense`` does to ``update`` apart from its noise.

    ``clip`` scales it; noise, unbiased rounding and DP-SGD (whose clipping is the replay's) leave
    its mean as it is.
    """
    if defense.name == "clip":
        norm = float(torch.stack([u.double().square().sum() for u in update]).sum().sqrt())
        scale = min(1.0, defense.number("max-norm", 1.0) / max(norm, 1e-12))
        return [u * scale for u in update]
    return list(update)


def pruning_thresholds(observed: Sequence[torch.Tensor], prune: PublishedDefense
                       ) -> list[float]:
    """Return t_l, the smallest kept magnitude per layer.

    t_l: the smallest kept magnitude per layer (``scope=global``: over the whole update); a layer
    with nothing kept: the global one.
    """
    def smallest(tensors: Sequence[torch.Tensor]) -> float:
        kept = [t.abs()[t != 0] for t in tensors]
        kept = [k for k in kept if k.numel()]
        return float(torch.cat(kept).min()) if kept else 0.0

    overall = smallest(observed)
    if prune.params.get("scope", "layer") == "global":
        return [overall] * len(observed)
    return [smallest([o]) if bool((o != 0).any()) else overall for o in observed]


def mechanism_replay(base: RestartsUpdateFn, observation: Observation) -> RestartsUpdateFn:
    """Return the replay both candidates are judged with.

    DP-SGD's per-example clipping where the ``dp-clipped`` replay fits the observation (any n: for
    one image it is a scale, which E is not blind to), else ``base``.
    """
    clipped = create_replay("dp-clipped")
    try:
        clipped.check(observation)
    except PartError:
        return base
    return clipped.wrap(base, observation)
