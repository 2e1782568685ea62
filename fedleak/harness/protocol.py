"""The federated user's local update, written once and used by both sides.

The victim calls :func:`local_update` without a graph to produce what it sends; an attack
receives :meth:`UpdateSimulator.__call__` and calls it with a graph to differentiate the same
computation with respect to candidate images (:meth:`UpdateSimulator.restarts` does so for many
candidate batches at once, under ``torch.func.vmap``). A loss defined twice drifts, so this
is the only place the user's loss and optimiser live.

FedSGD (one gradient over the n private images, mean cross-entropy):

    g = ∇_θ (1/n) Σ_i CE(f_θ(x_i), y_i)

FedAvg (Inverting Gradients supplement eq. 1): E local epochs over the n images in mini-batches
of B taken in order (no shuffling, so the server can replay them), plain SGD at learning rate τ,
and the user sends the parameter delta

    Δ = θ_{k+l} − θ_k = −τ Σ_{m=1}^{l} ∇_θ L_{θ_{k+m−1}}(x_{b(m)}, y_{b(m)}).

Buffers (BatchNorm running statistics) are used as given. The model runs in training mode, as
a user's local training does; BatchNorm layers follow ``Protocol.batchnorm``: ``train``
normalises with the batch's own statistics (and moves the running ones), ``eval`` with the
running statistics, the setting of Geiping et al.'s experiments ("untrained networks cannot
propagate information through the network without running-mean and running-variance
estimates", supplement Sec. C). With one image and batch statistics, each channel's mean and
scale are normalised away before the gradient is formed, which is why attacks on BatchNorm
models do much worse under ``train``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from fedleak.defenses.base import PerExampleDefense
from fedleak.harness.second_order import lean_second_order

FEDSGD = "fedsgd"
FEDAVG = "fedavg"
PROTOCOLS = (FEDSGD, FEDAVG)
BATCHNORM_MODES = ("train", "eval")


class ProtocolError(ValueError):
    """Protocol settings that cannot describe a local update; the message says what to change."""


@dataclass(frozen=True)
class Protocol:
    """How the user turns global parameters and private data into an update.

    ``kind``: ``fedsgd`` (one gradient) or ``fedavg`` (parameter delta after local SGD).
    ``local_epochs`` E, ``batch_size`` B (0 = all n images in one batch) and ``learning_rate``
    τ only matter for FedAvg. ``batchnorm``: ``train`` (batch statistics) or ``eval`` (running
    statistics) for the model's BatchNorm layers; no effect on models without them.
    """

    kind: str = FEDSGD
    local_epochs: int = 1
    batch_size: int = 0
    learning_rate: float = 1e-4
    batchnorm: str = "train"

    def __post_init__(self) -> None:
        if self.kind not in PROTOCOLS:
            raise ProtocolError(f"unknown protocol {self.kind!r}; choose one of {PROTOCOLS}")
        if self.local_epochs < 1:
            raise ProtocolError(f"local_epochs must be >= 1, got {self.local_epochs}")
        if self.batch_size < 0:
            raise ProtocolError(f"batch_size must be >= 0 (0 = full batch), got {self.batch_size}")
        if not (self.learning_rate > 0 and self.learning_rate < float("inf")):
            raise ProtocolError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.batchnorm not in BATCHNORM_MODES:
            raise ProtocolError(f"unknown batchnorm mode {self.batchnorm!r}; choose one of "
                                f"{BATCHNORM_MODES}")

    def local_steps(self, num_images: int) -> int:
        """Number of SGD steps the user takes over ``num_images`` images."""
        if self.kind == FEDSGD:
            return 1
        return self.local_epochs * len(_batches(num_images, self.batch_size))

    def update_kind(self) -> str:
        """``gradient`` for FedSGD, ``delta`` for FedAvg."""
        return "gradient" if self.kind == FEDSGD else "delta"


def set_training_mode(model: nn.Module, protocol: Protocol) -> None:
    """Training mode for local training, BatchNorm layers as ``protocol.batchnorm`` says."""
    model.train()
    if protocol.batchnorm == "eval":
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


def _batches(n: int, batch_size: int) -> list[slice]:
    size = n if batch_size in (0, None) or batch_size >= n else batch_size
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def user_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The user's training loss: mean cross-entropy over the batch."""
    return F.cross_entropy(logits, labels)


def local_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: Protocol,
    create_graph: bool = False,
    functional: bool = False,
) -> list[torch.Tensor]:
    """The update the user sends, one tensor per parameter in ``parameters`` order.

    With ``create_graph`` the result is differentiable with respect to ``images`` (and the
    parameters); without it, the parameters are detached and the result carries no graph.
    With ``functional`` every gradient is taken with ``torch.func.grad`` instead of
    ``torch.autograd.grad`` (the same maths), so the whole update can run under
    ``torch.func.vmap`` — :meth:`UpdateSimulator.restarts` replays many candidates at once so.
    """
    names = list(parameters)
    if create_graph:
        params = dict(parameters)
    else:
        params = {k: v.detach().requires_grad_(True) for k, v in parameters.items()}
    set_training_mode(model, protocol)
    gradient = _functional_gradient if functional else _gradient
    if protocol.kind == FEDSGD:
        return gradient(model, params, buffers, images, labels, create_graph)
    start = params
    for _ in range(protocol.local_epochs):
        for batch in _batches(images.shape[0], protocol.batch_size):
            grads = gradient(model, params, buffers, images[batch], labels[batch], True)
            lr = protocol.learning_rate
            params = {k: params[k] - lr * g for k, g in zip(names, grads, strict=True)}
            if not create_graph:
                params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    return [(params[k] - start[k]) if create_graph else (params[k] - start[k]).detach()
            for k in names]


def _gradient(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    create_graph: bool,
) -> list[torch.Tensor]:
    logits = functional_call(model, {**params, **buffers}, (images,))
    loss = user_loss(logits, labels)
    return list(torch.autograd.grad(loss, list(params.values()), create_graph=create_graph))


def _functional_gradient(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    create_graph: bool,
) -> list[torch.Tensor]:
    """:func:`_gradient` through ``torch.func.grad``: composable with ``vmap`` and autograd.

    ``torch.func.grad`` always leaves a graph to tensors that require grad outside it, so
    ``create_graph`` needs no flag here (the victim's parameters are detached leaves either way).
    """

    def loss(p: dict[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return user_loss(functional_call(model, {**p, **b}, (images,)), labels)

    grads = grad(loss)(params, buffers)  # buffers are an input: BatchNorm updates them in place
    return [grads[k] for k in params]


class UpdateSimulator:
    """The server's differentiable replay of the user's local update at fixed global parameters.

    ``simulator(images, labels)`` returns what the user would have sent for that data, with a
    graph back to ``images``. Buffers are copied so the replay never moves the server's state.
    The replay is :func:`local_update` itself; its convolutions and batch norms carry lean
    second derivatives (:mod:`fedleak.harness.second_order`: same values, less work when an
    attack differentiates the update with respect to the images; no third derivatives).
    """

    def __init__(
        self,
        model: nn.Module,
        parameters: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        protocol: Protocol,
    ) -> None:
        self.model = model
        self.parameters = {k: v.detach() for k, v in parameters.items()}
        for v in self.parameters.values():
            v.requires_grad_(True)
        self.buffers = {k: v.detach().clone() for k, v in buffers.items()}
        self.protocol = protocol
        #: Whether :meth:`restarts` is available: not for models with training-mode
        #: BatchNorm, whose second derivatives under ``torch.func.vmap`` were measured to
        #: differ from the sequential replay (1e-2 relative on convnet FedAvg, far more on
        #: resnet20-4 FedAvg). Eval-mode BatchNorm is a fixed affine map and vectorises.
        self.vectorisable = protocol.batchnorm == "eval" or not any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        with lean_second_order():
            return local_update(
                self.model, self.parameters, self.buffers, images, labels, self.protocol, True
            )

    def local_steps(self, num_images: int) -> int:
        """How many local SGD steps the replay takes over ``num_images`` images."""
        return self.protocol.local_steps(num_images)

    def restarts(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """The user's update for R candidate batches at once: ``images`` [R, n, C, H, W].

        Returns one [R, *θ_l.shape] tensor per parameter: entry r is exactly what
        ``self(images[r], labels)`` returns (up to float rounding), differentiable with respect
        to ``images``. It is :func:`local_update` (``functional=True``) under
        ``torch.func.vmap`` over r, so each candidate batch is its own user and every candidate
        gets its own copy of the buffers. PyTorch's own second derivatives are used here (the
        lean ones do not support ``torch.func``). Only for :attr:`vectorisable` models: with
        training-mode BatchNorm the vmapped second derivatives did not match the sequential
        replay, so such models are refused.
        """
        if not self.vectorisable:
            raise ValueError(
                "restarts cannot be vectorised for a model with BatchNorm (torch.func's "
                "batch-norm rules do not reproduce the sequential replay); run them one by one"
            )
        if images.dim() != 5:
            raise ValueError(f"restarts takes images shaped [R, n, C, H, W], got {images.shape}")
        copies = images.shape[0]
        buffers = {k: v.expand(copies, *v.shape).clone() for k, v in self.buffers.items()}

        def one(x: torch.Tensor, own_buffers: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            return local_update(self.model, self.parameters, own_buffers, x, labels,
                                self.protocol, True, functional=True)

        return list(vmap(one, in_dims=(0, 0))(images, buffers))


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
) -> PrivateUpdate:
    """The user's local update with every step's gradient privatised by ``defense``.

    Same protocol as :func:`local_update` (FedSGD: one step over all n images, sending the
    privatised gradient; FedAvg: E epochs of SGD at τ, sending θ_new − θ), except that each
    step's gradient is ``defense.privatise`` of the per-example gradients. Batches are the
    protocol's in-order mini-batches, or, when the defense asks for Poisson sampling at rate q,
    ⌈1/q⌉ steps per epoch over batches that hold each image independently with probability q.
    """
    set_training_mode(model, protocol)
    n = images.shape[0]
    names = list(parameters)
    params = {k: v.detach() for k, v in parameters.items()}
    q = defense.sample_rate(n, protocol.batch_size)
    epochs = 1 if protocol.kind == FEDSGD else protocol.local_epochs
    steps = 0
    gradient: list[torch.Tensor] = []
    for _ in range(epochs):
        for batch in _step_batches(n, protocol, q, generator, images.device):
            expected = round(q * n) if q is not None else len(batch)
            if len(batch):
                per_example = per_example_gradients(model, params, buffers, images[batch],
                                                    labels[batch])
            else:  # an empty Poisson batch still releases noise
                per_example = [torch.zeros(1, *params[k].shape, dtype=params[k].dtype,
                                           device=params[k].device) for k in names]
            gradient = defense.privatise(per_example, max(expected, 1), generator)
            steps += 1
            if protocol.kind == FEDAVG:
                params = {k: params[k] - protocol.learning_rate * g
                          for k, g in zip(names, gradient, strict=True)}
    if protocol.kind == FEDSGD:
        update = gradient
    else:
        update = [params[k] - parameters[k].detach() for k in names]
    first = _batches(n, n if protocol.kind == FEDSGD else protocol.batch_size)[0]
    rate = q if q is not None else (first.stop - first.start) / n
    return PrivateUpdate(update=update, steps=steps, sample_rate=rate)


def _step_batches(
    n: int, protocol: Protocol, q: float | None, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor]:
    if q is None or protocol.kind == FEDSGD and q >= 1:
        size = n if protocol.kind == FEDSGD else None
        slices = [slice(0, n)] if size else _batches(n, protocol.batch_size)
        return [torch.arange(n, device=device)[s] for s in slices]
    steps = max(1, round(1 / q)) if protocol.kind == FEDAVG else 1
    return [torch.nonzero(torch.rand(n, generator=generator) < q).flatten().to(device)
            for _ in range(steps)]
