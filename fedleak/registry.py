"""Named plug-ins with typed configs: the one mechanism behind the attack and defense registries.

A :class:`Registry` maps a name to a class that has a ``Config`` dataclass. Built-ins register
with a decorator; third-party packages add theirs through an entry-point group, without
touching fedleak. :meth:`Registry.create` builds the config from string or typed options
(``-o key=value`` on the CLI, ``DefenseSpec.params`` on the wire) and refuses unknown names or
keys with the list of valid ones. This module imports nothing of fedleak, so both lower layers
(``attacks``, ``defenses``) can use it.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import sys
import types
import typing
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, Union, cast


class Plugin(Protocol):
    """What a registered class has: its registered name and its options as a dataclass."""

    name: ClassVar[str]
    Config: ClassVar[type[Any]]


T = TypeVar("T", bound=Plugin)
C = TypeVar("C", bound=type[Plugin])


class ConfigError(ValueError):
    """An unknown name or option, or an option value of the wrong type."""


class Registry(Generic[T]):
    """Classes of kind ``kind`` (``"attack"``, ``"defense"``) found by name."""

    def __init__(self, kind: str, entry_point_group: str,
                 error: type[ConfigError] = ConfigError, builtins: str | None = None) -> None:
        self.kind = kind
        self.group = entry_point_group
        self.error = error
        #: the module whose import registers the built-ins, imported on the first lookup (not
        #: at the registry's own import: a process that uses one built-in, a victim, does not
        #: pay for importing every family and their scipy)
        self.builtins = builtins
        self._classes: dict[str, type[T]] = {}
        self._broken: dict[str, str] = {}  # entry points that failed to load: why

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: make ``cls`` available as ``name`` (sets ``cls.name``)."""

        def wrap(cls: C) -> C:
            cls.name = name
            self._classes[name] = cast(type[T], cls)
            return cls

        return wrap

    def _load_builtins(self) -> None:
        """Import the built-ins' module once, before any name is looked up."""
        if self.builtins is not None:
            module, self.builtins = self.builtins, None
            importlib.import_module(module)

    def _load_entry_points(self) -> None:
        """Load plug-ins of the entry-point group; one that fails is remembered, not fatal."""
        self._load_builtins()
        for entry in entry_points(group=self.group):
            if entry.name in self._classes or entry.name in self._broken:
                continue
            where = f"{self.kind} plug-in {entry.name!r} ({entry.value}"
            where += f", package {entry.dist.name})" if entry.dist else ")"
            try:
                cls: Any = entry.load()
            except Exception as err:  # noqa: BLE001 - any import error of third-party code
                self._broken[entry.name] = f"{where} failed to load: {type(err).__name__}: {err}"
                continue
            config = getattr(cls, "Config", None)
            if not isinstance(cls, type) or not dataclasses.is_dataclass(config):
                self._broken[entry.name] = (f"{where} is not a class with a Config dataclass; "
                                            f"fix the entry point or the plug-in")
                continue
            plugin: Any = cls
            plugin.name = entry.name
            self._classes[entry.name] = plugin

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-in and from entry points."""
        self._load_entry_points()
        return tuple(sorted(self._classes))

    def get(self, name: str) -> type[T]:
        """Return the class registered as ``name``."""
        self._load_builtins()
        if name not in self._classes:
            self._load_entry_points()
        if name in self._broken:
            raise self.error(self._broken[name])
        if name not in self._classes:
            raise self.error(f"unknown {self.kind} {name!r}; choose one of "
                             f"{', '.join(self.names())}")
        return self._classes[name]

    def config(self, name: str, options: Mapping[str, Any] | None = None) -> Any:
        """Build the ``Config`` of ``name`` from ``options`` (strings converted to field types)."""
        cls = self.get(name)
        config_class = cls.Config
        fields = {f.name: f for f in dataclasses.fields(config_class)}
        hints = field_types(config_class)
        values: dict[str, Any] = {}
        for key, value in (options or {}).items():
            key = key.replace("-", "_")
            if key not in fields:
                valid = ", ".join(f.replace("_", "-") for f in fields) or "none"
                raise self.error(f"{self.kind} {name!r} has no option {key!r}; valid: {valid}")
            values[key] = _coerce(f"{self.kind} {name!r}", key, value,
                                  hints.get(key, fields[key].type), self.error)
        try:
            return config_class(**values)
        except (TypeError, ValueError) as err:
            raise self.error(f"{self.kind} {name!r}: {err}") from err

    def create(self, name: str, options: Mapping[str, Any] | None = None) -> T:
        """Return an instance of ``name`` configured with ``options``."""
        factory: Any = self.get(name)
        made: T = factory(self.config(name, options))
        return made

    def describe(self, name: str) -> str:
        """One line per option of ``name``: ``key (type, default): help``."""
        lines = []
        config_class = self.get(name).Config
        hints = field_types(config_class)
        for f in dataclasses.fields(config_class):
            default = f.default if f.default is not dataclasses.MISSING else "required"
            help_text = f.metadata.get("help", "")
            shown = type_name(hints.get(f.name, f.type))
            lines.append(f"{f.name.replace('_', '-')} ({shown}, default {default}): "
                         f"{help_text}")
        return "\n".join(lines)


def field_types(config_class: type) -> dict[str, Any]:
    """Return each field's type as an object, whatever the annotation style.

    ``typing.get_type_hints`` resolves string annotations (``from __future__ import
    annotations``) in the Config's module; where a name cannot be resolved the field's own
    annotation is kept (a built-in's name as the type).
    """
    try:
        module = sys.modules.get(getattr(config_class, "__module__", ""), None)
        return typing.get_type_hints(config_class, vars(module) if module else None)
    except Exception:  # an annotation naming something the module does not define
        out = {}
        for f in dataclasses.fields(config_class):
            out[f.name] = _builtin(f.type) if isinstance(f.type, str) else f.type
        return out


_BUILTINS = {"int": int, "float": float, "bool": bool, "str": str}


def _builtin(annotation: str) -> Any:
    """Return a string annotation of a plain built-in type as the type (else the string)."""
    return _BUILTINS.get(annotation.replace(" ", ""), annotation)


def type_name(annotation: Any) -> str:
    """Return a field's type as written: ``float``, ``int|None``, ``one of a|b``.

    The same whether the annotation was a string or a type object (``Literal`` and enums
    list their values).
    """
    if isinstance(annotation, str):
        return annotation.replace(" ", "")
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + "|".join(str(a.value if isinstance(a, enum.Enum) else a)
                                    for a in args)
    if origin in (Union, types.UnionType):
        return "|".join("None" if a is type(None) else type_name(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + "|".join(str(m.value) for m in annotation)
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace(" ", "").replace("typing.", "")


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _convert(value: str, annotation: Any) -> Any:
    """``value`` as ``annotation`` (ValueError where it is not one)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        if type(None) in args and value.strip().lower() in ("none", "null", ""):
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg)
            except ValueError:
                continue
        raise ValueError(value)
    if origin is Literal:
        for arg in args:
            shown = arg.value if isinstance(arg, enum.Enum) else arg
            if str(shown).lower() == value.strip().lower():
                return arg
            if isinstance(arg, bool) and value.strip().lower() in (_TRUE if arg else _FALSE):
                return arg
        raise ValueError(value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        for member in annotation:
            if value in (member.name, str(member.value)) or \
                    value.lower() == member.name.lower():
                return member
        raise ValueError(value)
    if annotation is bool:
        lowered = value.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise ValueError(value)
        return lowered in _TRUE
    if annotation is int:
        return int(value)
    if annotation is float:
        return float(value)
    if isinstance(annotation, str):  # an annotation nothing could resolve: a built-in name
        built = _builtin(annotation)
        if built is not annotation:
            return _convert(value, built)
    return value


def _coerce(
    owner: str, key: str, value: Any, annotation: Any, error: type[ConfigError]
) -> Any:
    """Return a string option as its field's type; a typed value as it is.

    Bool, int, float, ``Optional``/unions, ``Literal`` and enums are converted; a value that
    is none of them raises ``error`` naming the expected type.
    """
    if not isinstance(value, str):
        return value
    try:
        return _convert(value, annotation)
    except ValueError as err:
        raise error(f"{owner} option {key} expects {type_name(annotation)}, got "
                    f"{value!r}") from err
