"""A model named as the CLI and the proto carry it (``name:key=value,...``), and the error a
model that cannot be built raises."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: the zoo name of a user's own factory model (:mod:`~fedleak.harness.zoo.user_models`); its
#: one option is ``path`` (``module:factory``)
FACTORY = "factory"
FACTORY_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_factory(text: str) -> bool:
    """Whether ``text`` names a factory (``module:attribute``, no ``key=value`` options)."""
    return bool(FACTORY_PATH.match(text.strip())) and "=" not in text


class ModelError(ValueError):
    """A model name, option or input shape that cannot be built; the message says what to change."""


@dataclass(frozen=True)
class ModelSpec:
    """A model by name with its string-typed options, as the CLI and the proto carry it."""

    name: str
    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``name``, ``name:key=value,key=value``, or a user's factory
        ``module:factory`` (:mod:`~fedleak.harness.zoo.user_models`: the spec
        ``factory:path=module:factory``)."""
        if is_factory(text):
            return cls(FACTORY, {"path": text.strip()})
        if text.startswith(f"{FACTORY}:path="):
            return cls(FACTORY, {"path": text[len(f"{FACTORY}:path="):].strip()})
        name, _, rest = text.partition(":")
        options: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ModelError(f"model option {item!r} must look like key=value")
            options[key.strip()] = value.strip()
        return cls(name.strip(), options)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))


Shape = tuple[int, int, int]
