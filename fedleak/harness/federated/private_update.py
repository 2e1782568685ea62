"""The user's local update under a per-example defense (DP-SGD): the same protocol as
:func:`fedleak.harness.federated.local_update.local_update`, each step's gradient privatised.

Per-example gradients ∇_θ CE(f_θ(x_i), y_i) come from ``torch.func.vmap`` over single-image
losses; the defense (``PerExampleDefense.privatise``, Opacus's DP optimiser for ``dpsgd``) clips
them, adds noise and averages them into the step's gradient g̃. FedSGD sends g̃; FedAvg takes E
epochs of SGD steps θ ← θ − τ g̃ and sends θ_new − θ. With Poisson sampling at rate q each epoch
has ⌈1/q⌉ steps over batches that hold each image independently with probability q.

An audit trial may carry a :class:`TrialCanary`: one extra example after the user's n — a
gradient canary (its per-example gradient is the canary c itself) or an input canary (its
gradient is computed like any image's) — in the last batch of every epoch, or, under Poisson
sampling, in each step's batch with probability q; or several gradient canaries at once
(``rows``, an audit's coverage), each sampled on its own. Its row joins the per-example gradients
before the defense, so DP-SGD clips it and noises the sum as it does real data; the expected
batch size stays that of the real data. FedAvg's
steps are :func:`~fedleak.harness.federated.local_update.sgd_step`'s (momentum, weight decay,
Nesterov as the protocol says), the in-order batches visited in ``order`` when it shuffles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedleak.defenses.stages import PerExampleDefense
from fedleak.harness.federated.local_update import (
    CancelCheck,
    check_cancelled,
    set_training_mode,
    sgd_step,
    user_loss,
)
from fedleak.harness.federated.protocol import FEDAVG, FEDSGD, Protocol, local_batches


@dataclass(frozen=True)
class TrialCanary:
    """What one audit trial adds to the user's computation, before any defense: a gradient
    canary c (one tensor per parameter) or an input canary (a normalised image and label)."""

    gradient: list[torch.Tensor] | None = None
    image: torch.Tensor | None = None
    label: int | None = None
    #: several gradient canaries at once, as per-example rows [K, *θ_l.shape] per parameter
    rows: list[torch.Tensor] | None = None


@dataclass
class PrivateUpdate:
    """A locally trained update under a per-example defense, and what accounting needs."""

    update: list[torch.Tensor]
    steps: int
    sample_rate: float


def per_example_gradients(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
) -> list[torch.Tensor]:
    """∇_θ CE(f_θ(x_i), y_i) for every image i, stacked: one [n, *θ_l.shape] tensor per layer.

    Computed with ``torch.func.vmap`` over single-image losses; the model must not mix images
    (no BatchNorm in training mode — Opacus's ``ModuleValidator.fix`` replaces it).
    """
    names = list(params)

    def one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return user_loss(functional_call(model, {**p, **buffers}, (x[None],)), y[None])

    detached = {k: v.detach() for k, v in params.items()}
    grads = vmap(grad(one), in_dims=(None, 0, 0))(detached, images, labels)
    return [grads[k] for k in names]


def private_local_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: Protocol,
    defense: PerExampleDefense,
    generator: torch.Generator,
    cancelled: CancelCheck | None = None,
    canary: TrialCanary | None = None,
    order: torch.Tensor | None = None,
) -> PrivateUpdate:
    """The user's local update with every step's gradient privatised by ``defense``.

    Same protocol as :func:`local_update` (FedSGD: one step over all n images, sending the
    privatised gradient; FedAvg: E epochs of SGD at τ, sending θ_new − θ), except that each
    step's gradient is ``defense.privatise`` of the per-example gradients. Batches are the
    protocol's in-order mini-batches, or, when the defense asks for Poisson sampling at rate q,
    ⌈1/q⌉ steps per epoch over batches that hold each image independently with probability q.
    ``canary`` (an audit trial's) joins as one more example (module docstring).
    """
    set_training_mode(model, protocol)
    n = images.shape[0]
    names = list(parameters)
    params = {k: v.detach() for k, v in parameters.items()}
    q = defense.sample_rate(n, protocol.batch_size)
    epochs = 1 if protocol.kind == FEDSGD else protocol.local_epochs
    steps = 0
    gradient: list[torch.Tensor] = []
    velocity: list[torch.Tensor] | None = None
    for epoch in range(epochs):
        batches = _step_batches(n, protocol, q, generator, images.device)
        if order is not None and q is None and protocol.kind == FEDAVG:
            batches = [order[epoch][b] for b in batches]  # the user's shuffled order
        for index, batch in enumerate(batches):
            check_cancelled(cancelled)
            expected = round(q * n) if q is not None else len(batch)
            row = _step_canaries(model, params, buffers, canary, names, q, generator,
                                 index == len(batches) - 1)
            if len(batch):
                per_example = per_example_gradients(model, params, buffers, images[batch],
                                                    labels[batch])
                if row is not None:
                    per_example = [torch.cat([g, r]) for g, r in zip(per_example, row,
                                                                       strict=True)]
            elif row is not None:
                per_example = row
            else:  # an empty Poisson batch still releases noise
                per_example = [torch.zeros(1, *params[k].shape, dtype=params[k].dtype,
                                           device=params[k].device) for k in names]
            gradient = defense.privatise(per_example, max(expected, 1), generator)
            steps += 1
            if protocol.kind == FEDAVG:
                params, velocity = sgd_step(params, gradient, velocity, protocol)
    if protocol.kind == FEDSGD:
        update = gradient
    else:
        update = [params[k] - parameters[k].detach() for k in names]
    first = local_batches(n, n if protocol.kind == FEDSGD else protocol.batch_size)[0]
    rate = q if q is not None else (first.stop - first.start) / n
    return PrivateUpdate(update=update, steps=steps, sample_rate=rate)


def _step_canaries(model: nn.Module, params: Mapping[str, torch.Tensor],
                   buffers: Mapping[str, torch.Tensor], canary: TrialCanary | None,
                   names: list[str], q: float | None, generator: torch.Generator,
                   last: bool) -> list[torch.Tensor] | None:
    """The canary rows that join this step: under Poisson sampling each canary with
    probability q (one draw per canary), otherwise every canary in the epoch's last batch."""
    if canary is None:
        return None
    rows = canary_rows(model, params, buffers, canary, names)
    if q is None:
        return rows if last else None
    keep = torch.rand(rows[0].shape[0], generator=generator) < q
    if not bool(keep.any()):
        return None
    return [r[keep.to(r.device)] for r in rows]


def canary_rows(model: nn.Module, params: Mapping[str, torch.Tensor],
                buffers: Mapping[str, torch.Tensor], canary: TrialCanary,
                names: list[str]) -> list[torch.Tensor]:
    """The canaries' per-example gradients as rows [K, *θ_l.shape] per parameter (one row for
    a single gradient or input canary)."""
    if canary.rows is not None:
        rows = [r.to(params[k].device, params[k].dtype) for k, r in zip(names, canary.rows,
                                                                         strict=True)]
        if canary.image is None:
            return rows
        image = canary_rows(model, params, buffers, TrialCanary(image=canary.image,
                                                                label=canary.label), names)
        return [torch.cat([i, r]) for i, r in zip(image, rows, strict=True)]
    if canary.gradient is not None:
        return [g.to(params[k].device, params[k].dtype)[None]
                for k, g in zip(names, canary.gradient, strict=True)]
    assert canary.image is not None and canary.label is not None
    label = torch.tensor([canary.label], device=canary.image.device)
    return per_example_gradients(model, params, buffers, canary.image[None], label)


def _step_batches(
    n: int, protocol: Protocol, q: float | None, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor]:
    if q is None or protocol.kind == FEDSGD and q >= 1:
        size = n if protocol.kind == FEDSGD else None
        slices = [slice(0, n)] if size else local_batches(n, protocol.batch_size)
        return [torch.arange(n, device=device)[s] for s in slices]
    steps = max(1, round(1 / q)) if protocol.kind == FEDAVG else 1
    return [torch.nonzero(torch.rand(n, generator=generator) < q).flatten().to(device)
            for _ in range(steps)]
