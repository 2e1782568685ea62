"""Gradient-matching distances J(u, u*) with their gradients in the form the loops take.

A loop needs from J its value and ∂J/∂u written as a scale s times a cotangent g,
∂J/∂u = s·g (:class:`GradientObjective`), so that one vector–Jacobian product back to the
images, multiplied by s, is the gradient of eq. (1) of :mod:`fedleak.attacks.optimisation.composed`:

- the cosine distance (:class:`CosineObjective`, eq. (4) of Geiping et al. 2020), with
  a = ⟨u, u*⟩, b = ‖u‖², c = ‖u*‖ (computed once):

      J = 1 − a/(√b c),   ∂J/∂u = −u*/(√b c) + a u/(b^{3/2} c) = s·g,
      s = −1/(√b c),      g = u* − (a/b) u;

  its restart form, one value per row, is
  :class:`~fedleak.attacks.optimisation.restarts.RestartsCosineObjective`;
- the squared euclidean distance of DLG (:class:`EuclideanObjective`, Zhu et al. 2019; eq. (3)
  of Geiping et al.): J = Σ_l ‖u_l − u*_l‖², g = 2(u − u*), s = 1;
- a diagonal weighting D ≥ 0 of a cosine (:class:`WeightedObjective`, eq. (1) of
  :mod:`fedleak.attacks.optimisation.objectives`): J(D ⊙ u, D ⊙ u*), whose gradient is by the chain
  rule D ⊙ ∂J/∂(D ⊙ u), the cosine's g at the weighted vectors multiplied by D once more;
- a positive weight c of any of them (:class:`ScaledObjective`): c J, scale c s, so the
  priors' terms weigh 1/c times more.

g is written into the memory of the replayed update (consumed: used once), so no update-sized
tensor is allocated per iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch


class GradientObjective(Protocol):
    """What the optimisation loop needs from an objective over replayed updates.

    J alone (choosing the restart), and J with its cotangent g and scale s, ∂J/∂u = s·g (a step).
    """

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return J at ``candidate`` alone (for choosing the restart)."""

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Return J, its cotangent g and scale s with ∂J/∂u = s·g (for a step)."""


class CosineObjective:
    """Cosine objective ``1 − cos(u, u*)`` (Geiping et al. 2020, eq. 4).

    ``1 − cos(u, u*)`` over the whole update (eq. 4 of Geiping et al.) with its gradient with
    respect to ``u``.

    ``u*`` is fixed for the whole attack: its squared norm is computed once.
    """

    def __init__(self, observed: Sequence[torch.Tensor]) -> None:
        self.observed = [t.detach() for t in observed]
        squares = torch.stack([t.double().square().sum() for t in self.observed]).sum()
        self.observed_norm = squares.sqrt().to(self.observed[0].dtype)

    def dots(self, candidate: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``a = ⟨u, u*⟩`` and ``b = ‖u‖²`` (0-dim tensors, no synchronisation).

        Both per tensor, one right after the other, so the second read of ``u_l`` hits the cache.
        """
        cross, square = [], []
        for u, o in zip(candidate, self.observed, strict=True):
            flat = u.reshape(-1)
            cross.append(torch.vdot(flat, o.reshape(-1)))
            square.append(torch.vdot(flat, flat))
        return torch.stack(cross).sum(), torch.stack(square).sum()

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """``1 − a / (√b ‖u*‖)``."""
        a, b = self.dots([u.detach() for u in candidate])
        return 1 - a / (b.sqrt() * self.observed_norm)

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Return the objective and its gradient with respect to ``u`` as ``scale · g`` (c = ‖u*‖).

            ∂/∂u = −u*/(√b c) + a u/(b^{3/2} c) = scale · g,  scale = −1/(√b c),  g = u* − (a/b) u.

        ``g`` is written into the memory of ``candidate`` in one pass (the replayed update is
        consumed: it is used once), so no update-sized tensor is allocated per iteration.
        """
        detached = [u.detach() for u in candidate]
        a, b = self.dots(detached)
        root_b = b.sqrt()
        value = 1 - a / (root_b * self.observed_norm)
        scale = -1 / (root_b * self.observed_norm)
        ratio = -a / b
        for u, o in zip(detached, self.observed, strict=True):
            torch.addcmul(o, u, ratio, out=u)
        return value, detached, scale


class EuclideanObjective:
    """DLG's squared L2 distance (Geiping et al. 2020, eq. 3; Zhu et al. 2019).

    DLG's squared distance ``J(u) = Σ_l ‖u_l − u*_l‖²`` (eq. (3) of Geiping et al.), with its
    gradient ``∂J/∂u = 2 (u − u*)`` in the form the optimisation loop takes (scale 1).

    With ``rows`` the candidates carry a leading restart dimension and J is one value per
    row ([R]); ``u*`` is shared by the rows, or given per row when it has that dimension too.
    """

    def __init__(self, observed: Sequence[torch.Tensor], rows: bool = False) -> None:
        self.observed = [t.detach() for t in observed]
        self.rows = rows

    def _reduce(self, differences: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.rows:
            return torch.stack([d.square().reshape(d.shape[0], -1).sum(1)
                                for d in differences]).sum(0)
        return torch.stack([d.square().sum() for d in differences]).sum()

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """J at ``candidate``."""
        return self._reduce([u.detach() - o for u, o in
                             zip(candidate, self.observed, strict=True)])

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """J, the cotangents 2 (u − u*) (written into the candidate's memory) and scale 1."""
        detached = [u.detach() for u in candidate]
        for u, o in zip(detached, self.observed, strict=True):
            u.sub_(o)
        value = self._reduce(detached)
        for d in detached:
            d.mul_(2)
        return value, detached, torch.ones_like(value)


class WeightedObjective:
    """Weighted cosine objective of eq. (1): the cosine of D ⊙ u and D ⊙ u*.

    Eq. (1): an unweighted cosine objective applied to D ⊙ u and D ⊙ u*, its gradient multiplied by
    D (the chain rule). ``inner`` builds the cosine (one update, or restarts).
    """

    def __init__(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
                 diag: Sequence[torch.Tensor], **options: Any) -> None:
        self.diag = list(diag)
        self.inner = inner([o * d for o, d in zip(observed, self.diag, strict=True)], **options)

    def _weighted(self, candidate: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [u.detach() * d for u, d in zip(candidate, self.diag, strict=True)]

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """J at ``candidate``."""
        value: torch.Tensor = self.inner.value(self._weighted(candidate))
        return value

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """J, the cotangents D ⊙ g (g the cosine's, at D ⊙ u) and the cosine's scale."""
        value, grads, scale = self.inner.value_and_output_grads(self._weighted(candidate))
        return value, [g.mul_(d) for g, d in zip(grads, self.diag, strict=True)], scale


class ScaledObjective:
    """A gradient-matching objective times a positive weight c (one, or one per row).

    c J, whose gradient is c s g, so the loop's priors (α TV, bn R_BN) weigh 1/c times more.
    """

    def __init__(self, base: Any, weight: torch.Tensor) -> None:
        self.base = base
        self.weight = weight

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return c J at ``candidate``."""
        value: torch.Tensor = self.base.value(candidate) * self.weight
        return value

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Return c J, the base's cotangents g and the scale c s (∂(cJ)/∂u = c s g)."""
        value, grads, scale = self.base.value_and_output_grads(candidate)
        return value * self.weight, grads, scale * self.weight
