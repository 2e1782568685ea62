"""A defense chain: the user's defenses in order, grouped by the stage at which they act.

Specs come as ``name:key=value,key=value`` (``--defense``, repeatable) or as the tables of a
TOML document (the harness reads the file; this module only checks what it holds)::

    [[defense]]
    name = "dpsgd"
    noise_multiplier = 0.5

At most one per-example defense (it owns local training's gradient) and at most one transport
defense; update defenses apply in the order given. Defenses are grouped by the stage they
declare, never by their class; :meth:`DefenseChain.update_composition` composes the update
stage's declared mechanisms and :attr:`DefenseChain.accountant` accounts what they earn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from fedleak.defenses.accounting import accounted
from fedleak.defenses.composition import ChainAccountant, UpdateComposition, compose_update
from fedleak.defenses.defense_registry import DefenseConfigError, create_defense
from fedleak.defenses.mechanism import DeclarationError, Mechanism
from fedleak.defenses.stages import (
    Defense,
    ParameterCheck,
    PerExampleDefense,
    TransportDefense,
    UpdateDefense,
)


@dataclass
class DefenseChain:
    """The user's defenses in order, each reached through the stage it declares."""

    defenses: list[Defense] = field(default_factory=list)

    _accountant: ChainAccountant | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        """Refuse two per-example or transport defenses, a bad declaration, a bad pairing."""
        for stage in ("per-example", "transport"):
            named = [d.name for d in self.defenses if d.stage == stage]
            if len(named) > 1:
                raise DefenseConfigError(f"at most one {stage} defense, got {named}")
        for defense in self.defenses:
            try:
                defense.declared()
            except DeclarationError as err:
                raise DefenseConfigError(f"defense {defense.name!r}: {err}") from None
        for defense in self.update:
            problem = defense.chain_problem(has_transport=self.transport is not None)
            if problem:
                raise DefenseConfigError(problem)
        for what, mechanism in (("the per-example defense", self.per_example_mechanism),
                                ("the update defenses", self.update_composition().mechanism())):
            try:  # a noise the accountant cannot compute ε for is refused now, not per round
                accounted(mechanism)
            except DeclarationError as err:
                raise DefenseConfigError(f"{what}: {err}") from None

    def _staged(self, stage: str) -> list[Defense]:
        return [d for d in self.defenses if d.stage == stage]

    @property
    def parameter_checks(self) -> list[ParameterCheck]:
        """The defenses that inspect the server's parameters before training, in order."""
        return cast(list[ParameterCheck], self._staged("parameters"))

    @property
    def per_example(self) -> PerExampleDefense | None:
        """The defense that owns local training's per-example gradients, if any."""
        return cast(PerExampleDefense | None, next(iter(self._staged("per-example")), None))

    @property
    def update(self) -> list[UpdateDefense]:
        """The defenses of the finished update, in the order they apply."""
        return cast(list[UpdateDefense], self._staged("update"))

    @property
    def transport(self) -> TransportDefense | None:
        """The defense between users on the way to the server (secure aggregation), if any."""
        return cast(TransportDefense | None, next(iter(self._staged("transport")), None))

    # -- declarations ---------------------------------------------------------------------

    def declarations(self) -> list[tuple[str, str, Mechanism | None]]:
        """(name, stage, declared mechanism or None) per defense, in order."""
        return [(d.name, d.stage, d.declared()) for d in self.defenses]

    @property
    def per_example_mechanism(self) -> Mechanism | None:
        """The per-example defense's declaration (None: none, or it declares nothing)."""
        defense = self.per_example
        return defense.declared() if defense is not None else None

    @property
    def transport_mechanism(self) -> Mechanism | None:
        """The transport defense's declaration (None: none, or it declares nothing)."""
        defense = self.transport
        return defense.declared() if defense is not None else None

    def update_composition(self) -> UpdateComposition:
        """Compose the update stage's declarations up to the first Gaussian noise."""
        return compose_update([(d.name, d.declared()) for d in self.update])

    @property
    def accountant(self) -> ChainAccountant:
        """The accountants the declarations earn, kept over the victim's life."""
        if self._accountant is None:
            self._accountant = ChainAccountant(self.per_example_mechanism,
                                               self.update_composition())
        return self._accountant

    def delta(self, default: float = 1e-5) -> float:
        """δ of the chain's reported (ε, δ): the first declaration's that accounts."""
        accountant = self.accountant
        for part in (accountant.per_example, accountant.update):
            if part is not None:
                return part.mechanism.delta
        return default

    def describe(self) -> list[tuple[str, dict[str, str], str]]:
        """Return (name, public params, stage) per defense, for ``Describe``.

        The params carry the declared mechanism as ``declared.*`` entries (Kerckhoffs: a claim
        is public).
        """
        out = []
        for d in self.defenses:
            declared = d.declared()
            params = {**d.public_params(), **(declared.to_params() if declared else {})}
            out.append((d.name, params, d.stage))
        return out


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
    """Return the ``[[defense]]`` tables of a parsed TOML document as (name, params) pairs."""
    tables = data.get("defense", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) and "name" in t
                                               for t in tables):
        raise DefenseConfigError(f"{source}: write each defense as a [[defense]] table with a "
                                 "name")
    return [(t["name"], {k: v for k, v in t.items() if k != "name"}) for t in tables]


def build_chain(specs: list[tuple[str, dict[str, Any]]]) -> DefenseChain:
    """Instantiate every (name, params); unknown names or keys raise with the valid ones."""
    return DefenseChain([create_defense(name, params) for name, params in specs])
