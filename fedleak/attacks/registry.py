"""Attacks found by name: a decorator fills the registry, and the entry-point group
``fedleak.attacks`` lets a third-party package add its own without touching fedleak.

Each attack class has a ``Config`` dataclass; :func:`create_attack` builds it from string or
typed options and refuses unknown names or keys with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from fedleak.attacks.base import Attack

ENTRY_POINT_GROUP = "fedleak.attacks"
_ATTACKS: dict[str, type[Attack]] = {}
A = TypeVar("A", bound=type[Attack])


class AttackConfigError(ValueError):
    """An unknown attack name or option, or an option value of the wrong type."""


def register_attack(name: str) -> Callable[[A], A]:
    """Class decorator: make ``cls`` available as ``name``."""

    def wrap(cls: A) -> A:
        cls.name = name
        _ATTACKS[name] = cls
        return cls

    return wrap


def _load_entry_points() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _ATTACKS:
            cls = entry.load()
            cls.name = entry.name
            _ATTACKS[entry.name] = cls


def attack_names() -> tuple[str, ...]:
    """Every registered attack name, built-in and from entry points."""
    _load_entry_points()
    return tuple(sorted(_ATTACKS))


def attack_class(name: str) -> type[Attack]:
    """The class registered as ``name``."""
    if name not in _ATTACKS:
        _load_entry_points()
    if name not in _ATTACKS:
        raise AttackConfigError(f"unknown attack {name!r}; choose one of {', '.join(attack_names())}")
    return _ATTACKS[name]


def create_attack(name: str, options: Mapping[str, Any] | None = None) -> Attack:
    """Build attack ``name`` with ``options`` (strings are converted to the field's type)."""
    cls = attack_class(name)
    fields = {f.name: f for f in dataclasses.fields(cls.Config)}
    values: dict[str, Any] = {}
    for key, value in (options or {}).items():
        key = key.replace("-", "_")
        if key not in fields:
            valid = ", ".join(fields) or "none"
            raise AttackConfigError(f"attack {name!r} has no option {key!r}; valid: {valid}")
        values[key] = _coerce(name, key, value, fields[key].type)
    return cls(cls.Config(**values))


def _coerce(attack: str, key: str, value: Any, annotation: Any) -> Any:
    if not isinstance(value, str):
        return value
    kind = str(annotation).replace(" ", "")
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
    except ValueError as err:
        raise AttackConfigError(
            f"attack {attack!r} option {key} expects {kind}, got {value!r}"
        ) from err
    return value


def describe_options(name: str) -> str:
    """One line per option of attack ``name``: ``key (type, default): help``."""
    cls = attack_class(name)
    lines = []
    for f in dataclasses.fields(cls.Config):
        default = f.default if f.default is not dataclasses.MISSING else "required"
        help_text = f.metadata.get("help", "")
        lines.append(f"{f.name.replace('_', '-')} ({f.type}, default {default}): {help_text}")
    return "\n".join(lines)
