"""Defenses found by name.

``@register_defense`` registers the built-ins, the ``fedleak.defenses`` entry-point group
third-party packages. ``DefenseSpec{name, params}`` on the wire and ``--defense
name:key=value`` on the CLI both resolve here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fedleak.defenses.stages import Defense
from fedleak.registry import ConfigError, Registry

ENTRY_POINT_GROUP = "fedleak.defenses"
D = TypeVar("D", bound=type[Defense])


class DefenseConfigError(ConfigError):
    """An unknown defense name or parameter, or a parameter value that cannot be used."""


DEFENSES: Registry[Defense] = Registry("defense", ENTRY_POINT_GROUP, DefenseConfigError)


def register_defense(name: str) -> Callable[[D], D]:
    """Class decorator: make ``cls`` available as ``name``."""
    return DEFENSES.register(name)


def create_defense(name: str, params: Mapping[str, Any] | None = None) -> Defense:
    """Build defense ``name`` from ``params`` (strings converted to the config's types)."""
    return DEFENSES.create(name, params)


def defense_names() -> tuple[str, ...]:
    """Return the name of every defense, built-in or from an installed package."""
    return DEFENSES.names()
