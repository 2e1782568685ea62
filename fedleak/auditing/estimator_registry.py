"""Estimators found by name, as attacks and defenses are.

A new estimator is one registered class (``@register_estimator``, or the ``fedleak.estimators``
entry-point group).

An estimator reads a :class:`Game` — the primary canary's scores and secret coins, the
calibration split or declared threshold, the chain's declared claim for one trial, and, when
the audit covered the mechanism with many canaries, the victim's :class:`~fedleak.auditing.
noise_ratio.StreamTable` — and returns :class:`Findings`: ε figures
(:class:`~fedleak.auditing.result.AuditBound`, bounds or estimates) and tests of the
declaration (:class:`~fedleak.auditing.result.DeclarationTest`, each with a p-value).
:func:`fedleak.auditing.verdict.evaluate` runs every registered estimator, shares the
false-alarm rate among all their tests (:meth:`Estimator.tests` says how many each runs) and
rejects by Holm's procedure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from fedleak.auditing.estimators.noise_ratio import StreamTable
from fedleak.auditing.result import AuditBound, DeclarationTest
from fedleak.registry import ConfigError, Registry

ENTRY_POINT_GROUP = "fedleak.estimators"


class EstimatorConfigError(ConfigError):
    """An unknown estimator name or option."""


class DeclaredFamily(Protocol):
    """The chain's claim for one trial, as the estimators need it.

    ε at δ, the trial's Gaussian μ (fixed batches, update stage) or Poisson (σ, q, steps), and ε of
    the same family with its noise divided by a ratio.
    """

    @property
    def epsilon(self) -> float:
        """Return the claimed ε at δ."""

    @property
    def delta(self) -> float:
        """Return the claim's δ."""

    @property
    def mu(self) -> float | None:
        """Return the trial's Gaussian μ (fixed batches, update stage), else None."""

    @property
    def sigma(self) -> float | None:
        """Return the noise multiplier σ of a Poisson-sampled claim, else None."""

    @property
    def sample_rate(self) -> float | None:
        """Return the Poisson sampling rate q, else None."""

    @property
    def steps(self) -> int:
        """Return the number of steps the claim composes."""

    def epsilon_at(self, ratio: float) -> float:
        """Return ε at δ of the same family with its noise divided by ``ratio``."""


@dataclass(frozen=True)
class GameSettings:
    """δ and confidence of the bounds, and what was audited (carried into every result)."""

    delta: float
    confidence: float
    canary: str
    threat_model: str

    def __post_init__(self) -> None:
        """Refuse δ outside [0, 1) and a confidence outside (0, 1)."""
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must lie in [0, 1), got {self.delta}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")

    @property
    def alpha(self) -> float:
        """Return α = 1 − confidence."""
        return 1 - self.confidence


@dataclass(frozen=True)
class Game:
    """Everything an estimator may read (module docstring)."""

    scores: np.ndarray
    coins: np.ndarray
    calibration: np.ndarray
    settings: GameSettings
    declared_threshold: float | None = None
    claim: DeclaredFamily | None = None
    streams: StreamTable | None = None
    #: the family-wise false-alarm rate of the verdict, and the power its statements use
    false_alarm: float = 1e-4
    power: float = 0.95

    @property
    def claims(self) -> bool:
        """Whether the chain claims a finite ε for one trial (a claim to test)."""
        return self.claim is not None and self.claim.epsilon < float("inf")


@dataclass
class Findings:
    """What one estimator found."""

    bounds: list[AuditBound] = field(default_factory=list)
    tests: list[DeclarationTest] = field(default_factory=list)


class Estimator(ABC):
    """A registered estimator with a typed ``Config`` dataclass."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def tests(self, game: Game) -> int:
        """How many tests of the declaration :meth:`run` will return for ``game``."""
        return 0

    @abstractmethod
    def run(self, game: Game, level: float) -> Findings:
        """Return findings for ``game``.

        Each test's p-value, and any bound the verdict relies on, at the per-test share ``level`` of
        the false-alarm rate.
        """


@dataclass
class NoOptions:
    """An estimator without options."""


E = TypeVar("E", bound=type[Estimator])

ESTIMATOR_REGISTRY: Registry[Estimator] = Registry("estimator", ENTRY_POINT_GROUP,
                                                   EstimatorConfigError)


def register_estimator(name: str) -> Callable[[E], E]:
    """Class decorator: make ``cls`` available as estimator ``name``."""
    return ESTIMATOR_REGISTRY.register(name)


#: the order the built-ins report in (plug-ins after them)
BUILTIN_ORDER = ("clopper-pearson", "gaussian-dp", "one-run", "subsampled-gaussian",
                 "gaussian-scores", "noise-level", "interference", "sampling", "one-shot")
