"""Reconstruction attacks as plain torch code, found by name through the registry.

A folder per family, the contracts at the top: ``base`` (the :class:`Attack` interface),
``observation`` and ``release`` (what the server holds, by threat model), ``registry``,
``parts`` (the registered parts of the optimisation attacks), ``labels``, ``published`` and
``replay_contract`` (what every family may read of the victim), and the families
``optimisation/``, ``exact/``, ``malicious/``, ``kkt/`` and ``text/``.

Importing this package registers the built-in attacks.
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
from fedleak.attacks.exact import analytic, spear  # noqa: F401  (registers the attacks)
from fedleak.attacks.exact.cocktail_party import cpa as cocktail_party  # noqa: F401
from fedleak.attacks.kkt import reconstruction  # noqa: F401
from fedleak.attacks.malicious import fishing, imprint, trap_weights  # noqa: F401
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.fedavg import shuffled, unrolled  # noqa: F401
from fedleak.attacks.optimisation.presets import (  # noqa: F401
    dlg,
    gradinversion,
    inverting_gradients,
    qian,
)
from fedleak.attacks.text import token_set  # noqa: F401  (registers the text attacks)
from fedleak.attacks.text.dager import gradient_inversion as dager_attack  # noqa: F401
from fedleak.attacks.text.lamp import named_attacks as lamp_attack  # noqa: F401

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
