"""Reconstruction attacks as plain torch code, found by name through the registry.

A folder per family, the contracts at the top: ``base`` (the :class:`Attack` interface),
``observation`` and ``release`` (what the server holds, by threat model), ``registry``,
``parts`` (the registered parts of the optimisation attacks), ``labels``, ``published`` and
``replay_contract`` (what every family may read of the victim), and the families
``optimisation/``, ``exact/``, ``malicious/``, ``kkt/`` and ``text/``.

The built-in attacks register on the first lookup by name
(:mod:`~fedleak.attacks.builtin_attacks`), so a process that imports one part of the package
does not import every family.
"""

from fedleak.attacks.attack_registry import (
    AttackConfigError,
    attack_class,
    attack_names,
    create_attack,
    describe_options,
    register_attack,
)
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.observation import Observation, Reconstruction

__all__ = [
    "Attack",
    "AttackConfigError",
    "Observation",
    "Progress",
    "Reconstruction",
    "attack_class",
    "attack_names",
    "create_attack",
    "describe_options",
    "register_attack",
]
