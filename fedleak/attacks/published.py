"""The defense chain a victim publishes (Kerckhoffs): what an adaptive attack may know.

``Describe`` reports every defense of the user's chain with its public parameters and stage
(``DefenseSpec``); the server keeps them in :attr:`Observation.defenses
<fedleak.attacks.observation.Observation.defenses>` as :class:`PublishedDefense` values, so a
defense-aware attack part (:mod:`fedleak.attacks.optimisation.objectives`,
:mod:`fedleak.attacks.optimisation.replays`) can read the mechanism it models without ever seeing
the defense's randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: The prefix of a published declaration's entries (fedleak.defenses.mechanism; attacks do not
#: import defenses)
DECLARED_PREFIX = "declared."


@dataclass(frozen=True)
class PublishedDefense:
    """One published defense: its registered name, public parameters and stage.

    The parameters are strings, with dashes, as ``DefenseSpec.params`` carries them; the stage
    is per-example, update or transport.
    """

    name: str
    params: Mapping[str, str] = field(default_factory=dict)
    stage: str = "update"

    def spec(self) -> str:
        """Return ``name:key=value,...`` (keys sorted), the form ``--defense`` takes.

        Runs record that form too. The declared mechanism (``declared.*`` entries) is left
        out: it is derived, not set.
        """
        options = self.options()
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in sorted(options.items()))
                            if options else "")

    def options(self) -> dict[str, str]:
        """Return the published parameters that configure the defense (without ``declared.*``)."""
        return {k: v for k, v in self.params.items() if not k.startswith(DECLARED_PREFIX)}

    def declared(self) -> dict[str, str]:
        """Return the declared mechanism's entries (``declared.*``), as published."""
        return {k: v for k, v in self.params.items() if k.startswith(DECLARED_PREFIX)}

    def number(self, key: str, default: float) -> float:
        """Return parameter ``key`` as a float (``default`` when not published).

        Raises
        ------
        ValueError
            Naming the key, when the published value is not a number.
        """
        raw = self.params.get(key, self.params.get(key.replace("-", "_")))
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"defense {self.name!r} publishes {key}={raw!r}, not a number; "
                             "an adaptive attack part cannot read it") from None


def published(items: Iterable[tuple[str, Mapping[str, str], str]]) -> tuple[PublishedDefense,
                                                                            ...]:
    """Turn ``(name, params, stage)`` triples into :class:`PublishedDefense` values.

    The triples ``DefenseChain.describe`` and ``DefenseSpec`` give.
    """
    return tuple(PublishedDefense(name, dict(params), stage) for name, params, stage in items)


def find(defenses: Iterable[PublishedDefense], name: str) -> PublishedDefense | None:
    """Return the first published defense called ``name``, or None."""
    return next((d for d in defenses if d.name == name), None)


def published_names(defenses: Sequence[PublishedDefense]) -> str:
    """Name the published chain in one phrase, ``prune, quantize`` (``none`` when empty)."""
    return ", ".join(d.name for d in defenses) or "none"
