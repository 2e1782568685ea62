"""Interval hinges: what a defense says the true update satisfies, coordinate by coordinate.

Some defenses bound each coordinate of the user's own update u(x*) given what they released,
lower_i ≤ u_i(x*) ≤ upper_i:

- magnitude pruning zeroes exactly the coordinates with ``|u_i| ≤ t``, t the smallest kept
  ``|u*|`` of the layer (or of the whole update, ``scope=global``): [−t, t] where u*_i = 0, no
  bound on the kept ones (:func:`pruning_bounds`, :func:`prune_thresholds`);
- stochastic rounding (QSGD) moves ``|u_i|`` to a neighbouring level of step Δ_l = m_l / s
  (``m_l = max|u*_l|``, s = 2^{bits−1} − 1 levels): u_i ∈ [u*_i − Δ_l, u*_i + Δ_l]
  (:func:`quantisation_bounds`).

:class:`IntervalHinge` adds β H to a gradient-matching objective,

    H(u) = Σ_i [max(0, u_i − upper_i)² + max(0, lower_i − u_i)²] / ‖u*‖²,
    ∂H/∂u_i = 2 (max(0, u_i − upper_i) − max(0, lower_i − u_i)) / ‖u*‖²,

0 at the truth, nothing asked of a coordinate inside its interval, in the units of the
cosine's residual (1 − cos ≈ ½‖u − u*‖²/‖u*‖² near the truth). The bounds are in the units of
the user's own update, so a hinge needs a chain that keeps its scale: pruning and quantisation
do; clipping, DP-SGD and added noise do not (:func:`require_known_scale` refuses them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.parts import PartError

SCALING = ("clip", "dpsgd", "noise")


def require_known_scale(observation: Observation, part: str) -> None:
    """Refuse a hinge when a published defense changes the update's scale or noise.

    Refuse a hinge when a published defense changes the update's scale or adds noise the bounds do
    not model (the hinge's bounds are in the units of the user's own update).
    """
    scaling = sorted({d.name for d in observation.defenses} & set(SCALING))
    if scaling:
        raise PartError(f"objective {part!r} with hinge > 0 bounds the update in the user's "
                        f"own units, but the victim publishes {', '.join(scaling)}, which "
                        "rescale or noise it; use hinge=0")


def prune_thresholds(observed: Sequence[torch.Tensor], scope: str, per_row: bool
                     ) -> list[torch.Tensor]:
    """Return the pruning threshold t per tensor (per row when ``per_row``).

    t per tensor (per row when ``per_row``): the smallest kept magnitude ``min{|u*_i| : u*_i ≠ 0}``
    of the layer (``scope`` layer) or of the whole update (``global``); 0 where nothing was kept (no
    bound is known there).
    """
    def smallest(o: torch.Tensor) -> torch.Tensor:
        flat = o.detach().reshape(o.shape[0], -1) if per_row else o.detach().reshape(1, -1)
        kept = torch.where(flat != 0, flat.abs(), torch.full_like(flat, math.inf)).amin(1)
        return kept

    per_tensor = [smallest(o) for o in observed]
    if scope == "global":
        overall = torch.stack(per_tensor).amin(0)
        per_tensor = [overall for _ in observed]
    out = []
    for o, t in zip(observed, per_tensor, strict=True):
        t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
        out.append(t.view(-1, *[1] * (o.dim() - 1)) if per_row else t.reshape(()))
    return out


def quantisation_bounds(observed: Sequence[torch.Tensor], bits: int, per_row: bool
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Return the support of stochastic rounding.

    QSGD rounds ``|u|`` to a neighbouring level of step Δ_l = m_l/s (m_l = max|u*_l|, which rounding
    keeps exactly; s = 2^{bits−1} − 1), so u_i ∈ [q_i − Δ_l, q_i + Δ_l] for every coordinate (and
    q_i ≠ 0 fixes the sign).
    """
    levels = 2 ** (bits - 1) - 1
    lower, upper = [], []
    for o in observed:
        o = o.detach()
        if per_row:
            scale = o.reshape(o.shape[0], -1).abs().amax(1).view(-1, *[1] * (o.dim() - 1))
        else:
            scale = o.abs().max()
        step = scale / levels
        lower.append(o - step)
        upper.append(o + step)
    return lower, upper


def pruning_bounds(observed: Sequence[torch.Tensor], scope: str, per_row: bool
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Return the interval [−t, t] magnitude pruning leaves on the zeroed coordinates.

    Magnitude pruning zeroes exactly the coordinates with ``|u_i| ≤ t`` (t the smallest kept
    ``|u*|``, :func:`prune_thresholds`): [−t, t] there; no bound (±inf) on the kept ones and in a
    tensor where nothing was kept.
    """
    lower, upper = [], []
    for o, t in zip(observed, prune_thresholds(observed, scope, per_row), strict=True):
        bounded = (o == 0) & (t > 0)
        inf = torch.full_like(o, math.inf)
        upper.append(torch.where(bounded, t.expand_as(o), inf))
        lower.append(-upper[-1])
    return lower, upper


class IntervalHinge:
    """Gradient-matching objective plus β H, a hinge on the defense's interval bounds.

    A gradient-matching objective plus β H, a hinge on what a defense says the true update satisfies
    coordinate by coordinate, lower_i ≤ u_i(x*) ≤ upper_i (:func:`pruning_bounds`,
    :func:`quantisation_bounds`):

        H(u) = Σ_i [max(0, u_i − upper_i)² + max(0, lower_i − u_i)²] / ‖u*‖²,

    0 at the truth, nothing asked of a coordinate inside its interval, in the units of the
    cosine's residual (1 − cos ≈ ½‖u − u*‖²/‖u*‖² near the truth), and
    ∂H/∂u_i = 2 (max(0, u_i − upper_i) − max(0, lower_i − u_i))/‖u*‖². The bounds are in the
    units of the user's own update, so a hinge needs a chain that keeps its scale (pruning and
    quantisation do; clipping and DP-SGD do not, see :func:`require_known_scale`). (Fitting
    the scale as the least-squares κ of the candidate onto u*, held fixed in the gradient, was
    tried: the attack diverged, lenet-zhu photo 5 at 6.7 dB.)
    """

    def __init__(self, base: Any, observed: Sequence[torch.Tensor],
                 bounds: tuple[list[torch.Tensor], list[torch.Tensor]], weight: float, *,
                 per_row: bool = False) -> None:
        self.base = base
        self.weight = weight
        self.per_row = per_row
        self.observed = [o.detach() for o in observed]
        self.lower, self.upper = bounds
        if per_row:
            squares = torch.stack([o.double().reshape(o.shape[0], -1).square().sum(1)
                                   for o in self.observed]).sum(0)
        else:
            squares = torch.stack([o.double().square().sum() for o in self.observed]).sum()
        self.energy = squares.to(self.observed[0].dtype)

    def hinge(self, candidate: Sequence[torch.Tensor]
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """H (0-dim, or [R] for stacked candidates) and ∂H/∂u per tensor."""
        us = [u.detach() for u in candidate]
        rows = self.per_row or us[0].dim() > self.observed[0].dim()
        value: torch.Tensor | None = None
        grads = []
        for u, lo, hi in zip(us, self.lower, self.upper, strict=True):
            e = self.energy.view(-1, *[1] * (u.dim() - 1)) if self.per_row else self.energy
            above = (u - hi).clamp(min=0)
            below = (lo - u).clamp(min=0)
            excess = (above.square() + below.square()) / e
            term = excess.reshape(excess.shape[0], -1).sum(1) if rows else excess.sum()
            value = term if value is None else value + term
            grads.append(2 * (above - below) / e)
        assert value is not None
        return value, grads

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return the base objective plus β H at ``candidate``."""
        extra, _ = self.hinge(candidate)
        total: torch.Tensor = self.base.value(candidate) + self.weight * extra
        return total

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Return the base's value, cotangents and scale s with β ∂H/∂u added.

        The base's value, cotangents and scale s with β ∂H/∂u added as (β/s) ∂H/∂u (the loop
        multiplies every cotangent by s).
        """
        extra, hinge_grads = self.hinge(candidate)  # before the base consumes ``candidate``
        value, grads, scale = self.base.value_and_output_grads(candidate)
        out = []
        for g, h in zip(grads, hinge_grads, strict=True):
            s = scale.view(-1, *[1] * (g.dim() - 1)) if scale.dim() else scale
            out.append(g + h * (self.weight / s))
        return value + self.weight * extra, out, scale
