"""Attacks found by name.

``@register_attack`` fills the registry, and the entry-point group ``fedleak.attacks`` lets a
third-party package add its own without touching fedleak.

Each attack class has a ``Config`` dataclass; :func:`create_attack` builds it from string or
typed options and refuses unknown names or keys with the list of valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fedleak.attacks.base import Attack
from fedleak.registry import ConfigError, Registry

ENTRY_POINT_GROUP = "fedleak.attacks"
A = TypeVar("A", bound=type[Attack[Any]])


class AttackConfigError(ConfigError):
    """An unknown attack name or option, or an option value of the wrong type."""


#: the built-in attacks register when their families are imported: on the first lookup
ATTACKS: Registry[Attack[Any]] = Registry("attack", ENTRY_POINT_GROUP, AttackConfigError,
                                          builtins="fedleak.attacks.builtin_attacks")


def register_attack(name: str) -> Callable[[A], A]:
    """Class decorator: make ``cls`` available as ``name``."""
    return ATTACKS.register(name)


def attack_names() -> tuple[str, ...]:
    """Every registered attack name, built-in and from entry points."""
    return ATTACKS.names()


def attack_class(name: str) -> type[Attack[Any]]:
    """Return the class registered as ``name``."""
    return ATTACKS.get(name)


def create_attack(name: str, options: Mapping[str, Any] | None = None) -> Attack[Any]:
    """Build attack ``name`` with ``options`` (strings are converted to the field's type)."""
    return ATTACKS.create(name, options)


def describe_options(name: str) -> str:
    """One line per option of attack ``name``: ``key (type, default): help``."""
    return ATTACKS.describe(name)
