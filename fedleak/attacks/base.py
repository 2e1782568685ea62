"""The interface every reconstruction attack implements, and the template it runs in.

:meth:`Attack.reconstruct` is the same for every attack: it checks that what it was given is
what the attack's threat model says the server holds (:data:`THREAT_MODELS`), resolves the
device and checks the target lives there, seeds torch's global generator from ``seed`` inside a
forked RNG state (so an attack that draws from it is reproducible and the caller's stream is
left as it was), and only then calls :meth:`Attack.recover`, the algorithm itself — the one
method an attack implements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch

from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.release import ReleasedModel
from fedleak.attacks.text_observation import TextObservation

#: ``progress(iteration, total, objective)`` — called now and then while an attack runs.
Progress = Callable[[int, int, float], None]

#: Threat model name → the type of what the server holds in it.
THREAT_MODELS: dict[str, type] = {"update": Observation, "release": ReleasedModel,
                                  "text-update": TextObservation}

#: What the server may do, weakest first: send the real global model (``honest``, the
#: honest-but-curious server), craft the *values* of θ it sends (``malicious-parameters``:
#: trap weights, fishing), or also have designed the architecture the user runs
#: (``malicious-architecture``: an imprint block in front of the model).
SERVER_ROLES = ("honest", "malicious-parameters", "malicious-architecture")

Target = TypeVar("Target", Observation, ReleasedModel, TextObservation)


@dataclass(frozen=True)
class UpdateSetting:
    """What a sweep knows of a point before attacking it.

    The update's kind (``gradient`` or ``delta``), the user's local steps, the images mixed in
    one update (a secure-aggregation sum: every user's) and the names of the defenses in the
    chain.
    """

    update_kind: str
    local_steps: int
    images: int
    defenses: tuple[str, ...] = ()


class HasParameters(Protocol):
    """Anything that carries its model's ``parameters`` (the device check reads them)."""

    parameters: list[torch.Tensor]


class Attack(ABC, Generic[Target]):
    """A reconstruction attack with a typed ``Config`` dataclass.

    Subclasses set ``Config`` (and ``threat_model`` when it is not ``"update"``) and implement
    :meth:`recover`. Attacks are plain torch code: they receive everything through the target
    (:class:`Observation` or :class:`ReleasedModel`) and never touch files or RPC.
    """

    name: ClassVar[str] = ""
    threat_model: ClassVar[str] = "update"
    #: which server this attack plays (one of :data:`SERVER_ROLES`); recorded with every run
    server_role: ClassVar[str] = "honest"
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Return why this attack cannot succeed at ``setting``, or None.

        A portfolio then leaves it out of that point. Default: None (it may).
        """
        return None

    def budget(self) -> int | None:
        """Return at most how many objective evaluations the attack spends per target.

        The common currency of a sweep's portfolio (``iterations`` here; the optimisation
        attacks count restarts and L-BFGS's inner evaluations), or None for an attack without
        one (analytic and malicious-server attacks).
        """
        iterations = getattr(self.config, "iterations", None)
        return iterations if isinstance(iterations, int) else None

    def reconstruct(
        self,
        target: Target,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        progress: Progress | None = None,
    ) -> Reconstruction:
        """Recover the user's data from ``target`` (see the module docstring for the steps).

        ``device`` is where the attack computes; an :class:`Observation` must have been built
        there (its ``simulate`` runs where its parameters live), a :class:`ReleasedModel` is
        moved by the attack. ``seed`` makes the run reproducible.
        """
        dev = resolve_device(device)
        self._check_target(target, dev)
        forked = [dev] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=forked):
            torch.manual_seed(seed)
            return self.recover(target, device=dev, seed=seed, progress=progress)

    def reconstruct_many(
        self,
        targets: Sequence[Target],
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        seeds: Sequence[int] | None = None,
        progress: Progress | None = None,
    ) -> list[Reconstruction]:
        """Attack several targets independently (rounds, private images, sweep points).

        Target i gets what ``reconstruct(targets[i], seed=seeds[i])`` gives, up to float
        rounding; ``seeds`` defaults to ``seed, seed + 1, …``.

        The same checks as :meth:`reconstruct` for every target; an attack that can pack the
        targets into one computation (one GPU kept busy) overrides :meth:`recover_many`.
        """
        if not targets:
            return []
        seeds = [seed + i for i in range(len(targets))] if seeds is None else list(seeds)
        if len(seeds) != len(targets):
            raise ValueError(f"reconstruct_many got {len(seeds)} seeds for {len(targets)} "
                             "targets; give one seed per target")
        dev = resolve_device(device)
        for target in targets:
            self._check_target(target, dev)
        forked = [dev] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=forked):
            return self.recover_many(targets, device=dev, seeds=seeds, progress=progress)

    def _check_target(self, target: Any, device: torch.device) -> None:
        """Check that the target is what this attack's threat model gives the server.

        And that it lives on ``device`` (an Observation's model).
        """
        expected = THREAT_MODELS[self.threat_model]
        if not isinstance(target, expected):
            raise TypeError(f"attack {self.name!r} (threat model {self.threat_model!r}) takes a "
                            f"target of type {expected.__name__}, got {type(target).__name__}")
        if isinstance(target, Observation | TextObservation):
            check_device(target, device)

    def recover_many(
        self,
        targets: Sequence[Target],
        *,
        device: torch.device,
        seeds: Sequence[int],
        progress: Progress | None,
    ) -> list[Reconstruction]:
        """Recover the targets one after the other, target i seeded with ``seeds[i]``.

        Seeded as :meth:`reconstruct` seeds it.
        """
        results = []
        for target, seed in zip(targets, seeds, strict=True):
            torch.manual_seed(seed)
            results.append(self.recover(target, device=device, seed=seed, progress=progress))
        return results

    @abstractmethod
    def recover(
        self,
        target: Target,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run the attack's algorithm: images (normalised space) and labels from ``target``."""


def resolve_device(device: torch.device | str) -> torch.device:
    """Return ``device`` as a ``torch.device`` with an index for CUDA; CUDA must be available."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but CUDA is not available")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_device(target: HasParameters, device: torch.device | str) -> torch.device:
    """``device`` resolved, after checking the target's parameters live there."""
    dev = resolve_device(device)
    for tensor in target.parameters[:1]:
        here = tensor.device
        if here.type != dev.type or (dev.index is not None and here.index != dev.index):
            raise ValueError(
                f"the observation's model lives on {here} but the attack was asked to run on "
                f"{dev}; build the observation (model, parameters, simulate) on {dev}"
            )
    return dev
