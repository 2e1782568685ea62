"""The built-in attacks: importing this module registers every family's attacks by name.

The registry (:mod:`~fedleak.attacks.attack_registry`) imports it on the first lookup.
"""

from fedleak.attacks.exact import analytic, spear  # noqa: F401  (registers the attacks)
from fedleak.attacks.exact.cocktail_party import cpa as cocktail_party  # noqa: F401
from fedleak.attacks.kkt import reconstruction  # noqa: F401
from fedleak.attacks.malicious import fishing, imprint, trap_weights  # noqa: F401
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

