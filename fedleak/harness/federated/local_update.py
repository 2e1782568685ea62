"""The federated user's local update, written once and used by both sides.

The victim calls :func:`local_update` without a graph to produce what it sends; an attack
receives :meth:`UpdateSimulator.__call__` and calls it with a graph to differentiate the same
computation with respect to candidate images (:meth:`UpdateSimulator.restarts` does so for many
candidate batches at once, under ``torch.func.vmap``). A loss defined twice drifts, so this
is the only place the user's loss and optimiser live.

FedSGD (one gradient over the n private images, mean cross-entropy):

    g = ∇_θ (1/n) Σ_i CE(f_θ(x_i), y_i)

FedAvg (Inverting Gradients supplement eq. 1): E local epochs over the n images in mini-batches
of B, SGD at learning rate τ, and the user sends the parameter delta Δ = θ_{k+l} − θ_k. Each
step m is ``torch.optim.SGD``'s (dampening 0) with momentum μ, weight decay λ and, optionally,
Nesterov's form:

    d_m = ∇_θ L_{θ_{m−1}}(x_{b(m)}, y_{b(m)}) + λ θ_{m−1}
    v_m = d_m (m = 1),  μ v_{m−1} + d_m (m > 1)
    θ_m = θ_{m−1} − τ (d_m + μ v_m  if Nesterov,  else v_m)

(μ = λ = 0: plain SGD, Δ = −τ Σ_m ∇_θ L_{θ_{m−1}}(x_{b(m)}, y_{b(m)})). The batches b(m) are
taken in order, or, with ``Protocol.shuffle``, in the order ``order[e]`` the caller drew for
epoch e (a ``DataLoader(shuffle=True)``): the victim draws it from its secret generator. The
server's replay cannot know it; when the order matters (several batches per epoch) it replays
epoch e on its *own copy* of the n candidate images in order — any order of the user's is one
assignment of images to those slots — and ties the copies together with an epoch-consistency
prior (Dimitrov et al., "Data Leakage in Federated Averaging", TMLR 2022, Sec. 4):
:meth:`UpdateSimulator.epoch_copies` says how many copies the replay takes.

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

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from fedleak.attacks.replay_contract import Replay
from fedleak.harness.federated.batch_norm import decomposed_batch_norm
from fedleak.harness.federated.protocol import FEDSGD, Protocol, local_batches
from fedleak.harness.federated.second_order import lean_second_order
from fedleak.harness.federated.visiting_order import (  # noqa: F401  (draw_order re-exported)
    copies_order,
    draw_order,
    epoch_copies,
)

#: ``cancelled()`` is asked before every local step; True stops the computation.
CancelCheck = Callable[[], bool]


class ComputationCancelled(Exception):
    """Local training stopped because its caller went away (cancelled or timed out)."""


def check_cancelled(cancelled: CancelCheck | None) -> None:
    """Raise :class:`ComputationCancelled` when ``cancelled()`` says so."""
    if cancelled is not None and cancelled():
        raise ComputationCancelled("the computation was cancelled")


def set_training_mode(model: nn.Module, protocol: Protocol) -> None:
    """Training mode for local training, BatchNorm layers as ``protocol.batchnorm`` says."""
    model.train()
    if protocol.batchnorm == "eval":
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


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
    cancelled: CancelCheck | None = None,
    order: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The update the user sends, one tensor per parameter in ``parameters`` order.

    With ``create_graph`` the result is differentiable with respect to ``images`` (and the
    parameters); without it, the parameters are detached and the result carries no graph.
    With ``functional`` every gradient is taken with ``torch.func.grad`` instead of
    ``torch.autograd.grad`` (the same maths), so the whole update can run under
    ``torch.func.vmap`` — :meth:`UpdateSimulator.restarts` replays many candidates at once so.
    ``cancelled`` is asked before every local step (:class:`ComputationCancelled` stops it).
    ``order`` [E, m] (FedAvg): epoch e visits ``images[order[e]]`` in mini-batches of B (the
    user's shuffled order, or the replay's per-epoch copies); None: every epoch in order.
    """
    names = list(parameters)
    if create_graph:
        params = dict(parameters)
    else:
        params = {k: v.detach().requires_grad_(True) for k, v in parameters.items()}
    set_training_mode(model, protocol)
    gradient = _functional_gradient if functional else _gradient
    check_cancelled(cancelled)
    if protocol.kind == FEDSGD:
        return gradient(model, params, buffers, images, labels, create_graph)
    if order is not None and order.shape[0] != protocol.local_epochs:
        raise ValueError(f"order has {order.shape[0]} epochs; the protocol takes "
                         f"{protocol.local_epochs}")
    start = params
    velocity: list[torch.Tensor] | None = None
    for epoch in range(protocol.local_epochs):
        visits = images.shape[0] if order is None else order.shape[1]
        for batch in local_batches(visits, protocol.batch_size):
            check_cancelled(cancelled)
            chosen: slice | torch.Tensor = batch if order is None else order[epoch][batch]
            grads = gradient(model, params, buffers, images[chosen], labels[chosen], True)
            params, velocity = sgd_step(params, grads, velocity, protocol)
            if not create_graph:
                params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
                velocity = None if velocity is None else [v.detach() for v in velocity]
    return [(params[k] - start[k]) if create_graph else (params[k] - start[k]).detach()
            for k in names]


def sgd_step(params: dict[str, torch.Tensor], grads: Sequence[torch.Tensor],
             velocity: list[torch.Tensor] | None, protocol: Protocol
             ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor] | None]:
    """One step of ``torch.optim.SGD`` (dampening 0) as the module docstring writes it:
    the new parameters and momentum buffers (None without momentum)."""
    lr, mu, decay = protocol.learning_rate, protocol.momentum, protocol.weight_decay
    names = list(params)
    steps = list(grads)
    if decay:
        steps = [g + decay * params[k] for k, g in zip(names, steps, strict=True)]
    if mu:
        velocity = steps if velocity is None else \
            [mu * v + d for v, d in zip(velocity, steps, strict=True)]
        steps = [d + mu * v for d, v in zip(steps, velocity, strict=True)] \
            if protocol.nesterov else velocity
    return {k: params[k] - lr * d for k, d in zip(names, steps, strict=True)}, velocity


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
    # allow_unused: a text replay from embeddings never looks its token embedding up (zero)
    return list(torch.autograd.grad(loss, list(params.values()), create_graph=create_graph,
                                    allow_unused=True, materialize_grads=True))


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


class UpdateSimulator(Replay):
    """The server's differentiable replay of the user's local update at fixed global parameters:
    the :class:`~fedleak.attacks.replay_contract.Replay` attacks receive.

    ``simulator(images, labels)`` returns what the user would have sent for that data, with a
    graph back to ``images``. Buffers are copied so the replay never moves the server's state.
    The replay is :func:`local_update` itself; its convolutions and batch norms carry lean
    second derivatives (:mod:`fedleak.harness.federated.second_order`: same values, less work
    when an attack differentiates the update with respect to the images; no third derivatives).
    """

    def __init__(
        self,
        model: nn.Module,
        parameters: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        protocol: Protocol,
        num_images: int | None = None,
    ) -> None:
        self.model = model
        #: the user's batch size n, when the server knows it: with a shuffled multi-epoch
        #: protocol the replay then takes :meth:`epoch_copies` copies of the candidates
        self.num_images = num_images
        self.parameters = {k: v.detach() for k, v in parameters.items()}
        for v in self.parameters.values():
            v.requires_grad_(True)
        self.buffers = {k: v.detach().clone() for k, v in buffers.items()}
        self.protocol = protocol
        #: Whether :meth:`restarts` and :meth:`pack` are available: for every model, since
        #: training-mode batch norm is replayed in elementary operations under ``vmap``
        #: (:mod:`fedleak.harness.federated.batch_norm`: torch.func's own rule for its double
        #: backward gives a wrong derivative). Kept as a flag for replays that cannot.
        self.vectorisable = True
        #: the visiting order an attack set (:meth:`visiting`), else None
        self.visit: torch.Tensor | None = None

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """The user's update for ``images``; each call starts from the global buffers (a
        training-mode forward moves a copy of them, never the server's own)."""
        own = {k: v.clone() for k, v in self.buffers.items()}
        with lean_second_order():
            return local_update(
                self.model, self.parameters, own, images, labels, self.protocol, True,
                order=self.order(images.shape[0], images.device)
            )

    def epoch_copies(self) -> int:
        """How many copies of the n candidate images a faithful replay takes (E when the
        user's unseen shuffling matters over several epochs, else 1): an attack that knows
        passes ``copies × n`` images, copy e replayed as epoch e in order (module docstring).
        Given only n images, the replay takes them in order every epoch, which is not the
        user's update when this is more than 1."""
        if self.num_images is None:
            return 1
        return epoch_copies(self.protocol, self.num_images)

    def order(self, rows: int, device: torch.device) -> torch.Tensor | None:
        """The visiting order for ``rows`` candidate images: the one :meth:`visiting` set, else
        per-epoch copies when ``rows`` is ``epoch_copies() × n``, else in order."""
        if self.visit is not None:
            return self.visit
        copies = self.epoch_copies()
        if copies > 1 and self.num_images is not None and rows == copies * self.num_images:
            return copies_order(self.protocol, self.num_images, device)
        return None

    def at(self, parameters: Mapping[str, torch.Tensor]) -> UpdateSimulator:
        """The same replay (model, buffers, protocol) at other global ``parameters``: a
        malicious server replays rounds at parameters it crafted."""
        return UpdateSimulator(self.model, parameters, self.buffers, self.protocol,
                               self.num_images)

    def local_steps(self, num_images: int) -> int:
        """How many local SGD steps the replay takes over ``num_images`` images."""
        return self.protocol.local_steps(num_images)

    def visiting(self, order: torch.Tensor) -> UpdateSimulator:
        """This replay visiting, in epoch e, the candidate rows ``order[e]`` [E, n] in
        mini-batches of B (the order an attack models for a shuffling user); the tensor is
        read at every call, so changing it in place changes the replay."""
        if order.dim() != 2 or order.shape[0] != self.protocol.local_epochs:
            raise ValueError(f"a visiting order is [epochs={self.protocol.local_epochs}, n], "
                             f"got {list(order.shape)}")
        out = UpdateSimulator(self.model, self.parameters, self.buffers, self.protocol,
                              self.num_images)
        out.visit = order
        return out

    def epochs(self) -> int:
        """E, the local epochs the replay takes."""
        return self.protocol.local_epochs

    def order_matters(self, num_images: int) -> bool:
        """Whether the user's secret order changes its update
        (:meth:`~fedleak.harness.federated.protocol.Protocol.order_matters`)."""
        return self.protocol.order_matters(num_images)

    def epoch_batches(self, num_images: int) -> list[slice]:
        """One epoch's mini-batches over ``num_images`` visits (slices of the order)."""
        return local_batches(num_images, self.protocol.batch_size)

    def step_weights(self, num_images: int) -> list[float]:
        """The first-order weight of each local step's gradient in the delta
        (:meth:`~fedleak.harness.federated.protocol.Protocol.step_weights`)."""
        return self.protocol.step_weights(num_images)

    def restarts(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """The user's update for R candidate batches at once: ``images`` [R, n, C, H, W].

        Returns one [R, *θ_l.shape] tensor per parameter: entry r is exactly what
        ``self(images[r], labels)`` returns (up to float rounding), differentiable with respect
        to ``images``. It is :func:`local_update` (``functional=True``) under
        ``torch.func.vmap`` over r, so each candidate batch is its own user and every candidate
        gets its own copy of the buffers. PyTorch's own second derivatives are used here (the
        lean ones do not support ``torch.func``), with training-mode batch norm written out in
        elementary operations (:func:`~fedleak.harness.federated.batch_norm.decomposed_batch_norm`),
        whose derivatives under ``vmap`` agree with finite differences.
        """
        if not self.vectorisable:
            raise ValueError("this replay cannot be vectorised; run the restarts one by one")
        if images.dim() != 5:
            raise ValueError(f"restarts takes images shaped [R, n, C, H, W], got {images.shape}")
        copies = images.shape[0]
        buffers = {k: v.expand(copies, *v.shape).clone() for k, v in self.buffers.items()}
        order = self.order(images.shape[1], images.device)

        def one(x: torch.Tensor, own_buffers: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            return local_update(self.model, self.parameters, own_buffers, x, labels,
                                self.protocol, True, functional=True, order=order)

        with decomposed_batch_norm():
            return list(vmap(one, in_dims=(0, 0))(images, buffers))

    def pack(self, others: Sequence[Replay]) -> PackedReplay:
        """One replay for this user and ``others`` (same architecture and protocol), each at
        its own global parameters: packed attacks on several rounds or images. ValueError
        when one of ``others`` is not an :class:`UpdateSimulator`."""
        simulators = [o for o in others if isinstance(o, UpdateSimulator)]
        if len(simulators) < len(others):
            raise ValueError("only the harness's replays can be packed together")
        return PackedReplay([self, *simulators])


class PackedReplay:
    """The user's update for P observations at once, each with its own θ_p and R candidates.

    ``packed(images [P, R, n, C, H, W], labels [P, n])`` returns one [P, R, *θ_l.shape]
    tensor per parameter; entry (p, r) is ``simulators[p](images[p, r], labels[p])`` up to
    float rounding: :func:`local_update` (``functional=True``) under ``torch.func.vmap`` over
    the candidates r inside ``vmap`` over the observations p, the parameters and buffers of
    observation p being its own. Every simulator must be :attr:`UpdateSimulator.vectorisable`
    and share the architecture (parameter names, shapes, dtypes) and the protocol.
    Training-mode batch norm is replayed in elementary operations, as in
    :meth:`UpdateSimulator.restarts`.
    """

    def __init__(self, simulators: Sequence[UpdateSimulator]) -> None:
        first = simulators[0]
        for other in simulators[1:]:
            if not other.vectorisable or other.protocol != first.protocol or \
                    other.num_images != first.num_images:
                raise ValueError("packed observations need one vectorisable architecture, "
                                 "one protocol and one batch size")
            if [(k, v.shape, v.dtype) for k, v in other.parameters.items()] != \
                    [(k, v.shape, v.dtype) for k, v in first.parameters.items()]:
                raise ValueError("packed observations need the same architecture")
        if not first.vectorisable:
            raise ValueError("this replay cannot be packed")
        self.model = first.model
        self.protocol = first.protocol
        self.first = first
        self.parameters = {k: torch.stack([s.parameters[k] for s in simulators]).detach()
                           for k in first.parameters}
        self.buffers = {k: torch.stack([s.buffers[k] for s in simulators])
                        for k in first.buffers}

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        if images.dim() != 6:
            raise ValueError(f"packed replay takes images [P, R, n, C, H, W], got {images.shape}")
        copies = images.shape[1]
        order = self.first.order(images.shape[2], images.device)

        def observation(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                        candidates: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            own = {k: v.expand(copies, *v.shape).clone() for k, v in buffers.items()}

            def one(x: torch.Tensor, b: dict[str, torch.Tensor]) -> list[torch.Tensor]:
                return local_update(self.model, params, b, x, y, self.protocol, True,
                                    functional=True, order=order)

            return list(vmap(one, in_dims=(0, 0))(candidates, own))

        with decomposed_batch_norm():
            return list(vmap(observation, in_dims=(0, 0, 0, 0))(self.parameters, self.buffers,
                                                                 images, labels))
