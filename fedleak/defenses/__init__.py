"""Defenses as plain torch/numpy/cryptography code, found by name through the registry.

Importing this package registers the built-in defenses.
"""

from fedleak.defenses import (  # noqa: F401  (registers the built-in defenses)
    client_dp,
    clip,
    dpsgd,
    noise,
    prune,
    quantize,
    secagg_defense,
    vet,
)
from fedleak.defenses.chain import DefenseChain, build_chain, defense_tables, parse_defense_spec
from fedleak.defenses.defense_registry import (
    DEFENSES,
    DefenseConfigError,
    create_defense,
    defense_names,
    register_defense,
)
from fedleak.defenses.stages import (
    STAGES,
    Defense,
    GaussianClaim,
    ParameterCheck,
    PerExampleDefense,
    TransportDefense,
    UpdateDefense,
)

__all__ = [
    "DEFENSES",
    "STAGES",
    "Defense",
    "DefenseChain",
    "DefenseConfigError",
    "GaussianClaim",
    "ParameterCheck",
    "PerExampleDefense",
    "TransportDefense",
    "UpdateDefense",
    "build_chain",
    "defense_tables",
    "create_defense",
    "defense_names",
    "parse_defense_spec",
    "register_defense",
]
