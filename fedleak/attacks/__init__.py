"""Reconstruction attacks as plain torch code, found by name through the registry.

Importing this package registers the built-in attacks.
"""

from fedleak.attacks import (  # noqa: F401  (registers the attacks)
    analytic,
    cocktail_party,
    dlg,
    fedavg,
    fishing,
    gradinversion,
    imprint,
    inverting_gradients,
    kkt,
    qian,
    shuffled_fedavg,
    spear,
    trap_weights,
)
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
from fedleak.attacks.text import (  # noqa: F401  (registers the text attacks)
    dager_attack,
    lamp_attack,
    token_set,
)

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
