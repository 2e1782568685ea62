"""The interface every reconstruction attack implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from fedleak.attacks.observation import Observation, Reconstruction

#: ``progress(iteration, total, objective)`` — called now and then while an attack runs.
Progress = Callable[[int, int, float], None]


class Attack(ABC):
    """A reconstruction attack with a typed ``Config`` dataclass.

    Subclasses set ``Config`` and implement :meth:`reconstruct`. Attacks are plain torch code:
    they receive everything through the :class:`Observation` and never touch files or RPC.
    """

    name: ClassVar[str] = ""
    threat_model: ClassVar[str] = "update"
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    @abstractmethod
    def reconstruct(
        self,
        observation: Observation,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        progress: Progress | None = None,
    ) -> Reconstruction:
        """Recover the user's images (normalised space) and labels from ``observation``."""
