"""A registered part of an optimisation attack: typed options, and a refusal that says why.

An optimisation attack (eq. (1) of :mod:`fedleak.attacks.optimisation.composed`) is composed of
parts, each a small class found by name in its own registry — objectives J
(:mod:`fedleak.attacks.optimisation.objectives`), replays u
(:mod:`fedleak.attacks.optimisation.replays`), priors R_k
(:mod:`fedleak.attacks.optimisation.priors`), optimisers
(:mod:`fedleak.attacks.optimisation.optimisers`) — with a ``Config`` dataclass of its options.
Unknown names and options are refused when the attack is configured; a part that does not fit an
observation (a mask without a pruning defense, a BatchNorm prior on a model without BatchNorm)
refuses it before the first iteration. Both raise :class:`PartError` saying what to change.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, ClassVar

from fedleak.attacks.observation import Observation
from fedleak.registry import ConfigError


class PartError(ConfigError):
    """An attack part that does not fit the observation, or an unknown part or option."""


class AttackPart(ABC):  # noqa: B024 - the kinds of part add their abstract method
    """A registered part of an optimisation attack, with a typed ``Config`` dataclass."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def check(self, observation: Observation) -> None:
        """Raise :class:`PartError` saying what to change when this part does not fit."""
        return None


@dataclass
class NoOptions:
    """A part without options."""
