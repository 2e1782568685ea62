"""The replay contract: what an attack may ask of ``Observation.simulate``, as a typed protocol.

Every observation carries ``simulate(images, labels) -> update``, the user's local update
replayed on candidate images with a graph (:data:`UpdateFn`). The harness's replay does more,
and says so by implementing :class:`Replay` explicitly: it runs many candidate batches at once
(``restarts``), packs several observations into one computation (``pack``), moves to other
global parameters (``at``), counts its local steps and per-epoch copies, and exposes the model,
parameters and buffers it replays. An attack asks ``isinstance(observation.simulate, Replay)``
once and is then type-checked against this contract; a plain function (a test's replay, a
malicious server's derived replay) offers only the call. Attacks never import the harness.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import nn

#: ``simulate(images, labels) -> update``: the user's local update at the global parameters,
#: differentiable with respect to ``images`` (normalised space, [n, C, H, W]).
UpdateFn = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]
#: ``restarts(images [R, n, C, H, W], labels [n]) -> [R, *θ_l.shape] per parameter``.
RestartsUpdateFn = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]
#: ``packed(images [P, R, n, C, H, W], labels [P, n]) -> [P, R, *θ_l.shape] per parameter``:
#: observation p's user replayed on its own θ_p for each of its R candidate batches.
PackedUpdateFn = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]


@runtime_checkable
class Relocatable(Protocol):
    """A replay that can be moved to other global parameters.

    A malicious server replays the rounds it crafted.
    """

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Return the user's update for ``images`` (see :data:`UpdateFn`)."""
        ...

    def at(self, parameters: Mapping[str, torch.Tensor]) -> Relocatable:
        """Return the same replay (model, buffers, protocol) at other global ``parameters``."""
        ...


@runtime_checkable
class Replay(Relocatable, Protocol):
    """The harness's replay of the user's local update, everything an attack may use of it.

    ``model`` with ``parameters`` (θ, by name) and ``buffers`` are what the replay runs: the
    BatchNorm prior reads its statistics from them. ``vectorisable`` says whether
    :meth:`restarts` and :meth:`pack` are available.
    """

    model: nn.Module
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    vectorisable: bool

    def at(self, parameters: Mapping[str, torch.Tensor]) -> Replay:
        """Return the same replay at other global ``parameters``."""
        ...

    def restarts(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Return the update for R candidate batches at once (see :data:`RestartsUpdateFn`)."""
        ...

    def pack(self, others: Sequence[Replay]) -> PackedUpdateFn:
        """Return one replay for this user and ``others``, each at its own parameters.

        They share architecture and protocol (see :data:`PackedUpdateFn`).

        Raises
        ------
        ValueError
            When they cannot be packed.
        """
        ...

    def local_steps(self, num_images: int) -> int:
        """Return how many local SGD steps the replay takes over ``num_images`` images."""
        ...

    def epoch_copies(self) -> int:
        """Return how many copies of the n candidate images a faithful replay takes.

        E when the user's unseen shuffling matters over several epochs, else 1.
        """
        ...


@runtime_checkable
class OrderedReplay(Replay, Protocol):
    """A replay whose visiting order the attack sets: the model of a user that shuffles.

    A FedAvg user with ``shuffle`` visits its n images in a secret order every epoch; the
    attack that models it (:mod:`fedleak.attacks.optimisation.fedavg.batch_order`) chooses the order
    itself — epoch e visiting candidate rows ``order[e]`` in mini-batches — and needs the protocol's
    public facts: E, one epoch's mini-batches and each local step's first-order weight in the
    delta (momentum weighs early steps more).
    """

    def visiting(self, order: torch.Tensor) -> OrderedReplay:
        """Return this replay with epoch e visiting candidate rows ``order[e]`` ([E, n]).

        ``order`` is read at every call (changing the tensor in place changes the replay).
        """
        ...

    def epochs(self) -> int:
        """Return E, the local epochs."""
        ...

    def order_matters(self, num_images: int) -> bool:
        """Tell whether the user's unseen order changes its update.

        It does when the user shuffles and an epoch takes several mini-batches.
        """
        ...

    def epoch_batches(self, num_images: int) -> list[slice]:
        """Return one epoch's mini-batches over ``num_images`` visits."""
        ...

    def step_weights(self, num_images: int) -> list[float]:
        """Return the step weights w_s with Δ ≈ −τ Σ_s w_s g_s (every g_s at the global θ)."""
        ...
