"""A defense chain: the user's defenses in order, grouped by the stage at which they act.

Specs come as ``name:key=value,key=value`` (``--defense``, repeatable) or as the tables of a
TOML document (the harness reads the file; this module only checks what it holds)::

    [[defense]]
    name = "dpsgd"
    noise_multiplier = 0.5

At most one per-example defense (it owns local training's gradient) and at most one transport
defense; update defenses apply in the order given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedleak.defenses.defense_registry import DefenseConfigError, create_defense
from fedleak.defenses.stages import (
    Defense,
    ParameterCheck,
    PerExampleDefense,
    TransportDefense,
    UpdateDefense,
)


@dataclass
class DefenseChain:
    defenses: list[Defense] = field(default_factory=list)

    def __post_init__(self) -> None:
        for stage in ("per-example", "transport"):
            named = [d.name for d in self.defenses if d.stage == stage]
            if len(named) > 1:
                raise DefenseConfigError(f"at most one {stage} defense, got {named}")
        for defense in self.update:
            problem = defense.chain_problem(has_transport=self.transport is not None)
            if problem:
                raise DefenseConfigError(problem)

    @property
    def parameter_checks(self) -> list[ParameterCheck]:
        return [d for d in self.defenses if isinstance(d, ParameterCheck)]

    @property
    def per_example(self) -> PerExampleDefense | None:
        return next((d for d in self.defenses if isinstance(d, PerExampleDefense)), None)

    @property
    def update(self) -> list[UpdateDefense]:
        return [d for d in self.defenses if isinstance(d, UpdateDefense)]

    @property
    def transport(self) -> TransportDefense | None:
        return next((d for d in self.defenses if isinstance(d, TransportDefense)), None)

    def describe(self) -> list[tuple[str, dict[str, str], str]]:
        """(name, public params, stage) per defense, for ``Describe``."""
        return [(d.name, d.public_params(), d.stage) for d in self.defenses]


def parse_defense_spec(text: str) -> tuple[str, dict[str, str]]:
    """``dpsgd:noise-multiplier=0.5,max-grad-norm=1`` → (``dpsgd``, {…})."""
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise DefenseConfigError(f"defense parameter {item!r} in {text!r} must look like "
                                     "key=value")
        params[key.strip()] = value.strip()
    if not name.strip():
        raise DefenseConfigError(f"defense spec {text!r} has no name")
    return name.strip(), params


def defense_tables(data: Mapping[str, Any], source: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[defense]]`` tables of a parsed TOML document as (name, params) pairs."""
    tables = data.get("defense", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) and "name" in t
                                               for t in tables):
        raise DefenseConfigError(f"{source}: write each defense as a [[defense]] table with a "
                                 "name")
    return [(t["name"], {k: v for k, v in t.items() if k != "name"}) for t in tables]


def build_chain(specs: list[tuple[str, dict[str, Any]]]) -> DefenseChain:
    """Instantiate every (name, params); unknown names or keys raise with the valid ones."""
    return DefenseChain([create_defense(name, params) for name, params in specs])
