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
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast


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
                 error: type[ConfigError] = ConfigError) -> None:
        self.kind = kind
        self.group = entry_point_group
        self.error = error
        self._classes: dict[str, type[T]] = {}
        self._broken: dict[str, str] = {}  # entry points that failed to load: why

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: make ``cls`` available as ``name`` (sets ``cls.name``)."""

        def wrap(cls: C) -> C:
            cls.name = name
            self._classes[name] = cast(type[T], cls)
            return cls

        return wrap

    def _load_entry_points(self) -> None:
        """Load plug-ins of the entry-point group; one that fails is remembered, not fatal."""
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
        values: dict[str, Any] = {}
        for key, value in (options or {}).items():
            key = key.replace("-", "_")
            if key not in fields:
                valid = ", ".join(f.replace("_", "-") for f in fields) or "none"
                raise self.error(f"{self.kind} {name!r} has no option {key!r}; valid: {valid}")
            values[key] = _coerce(f"{self.kind} {name!r}", key, value, fields[key].type,
                                  self.error)
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
        for f in dataclasses.fields(self.get(name).Config):
            default = f.default if f.default is not dataclasses.MISSING else "required"
            help_text = f.metadata.get("help", "")
            lines.append(f"{f.name.replace('_', '-')} ({type_name(f.type)}, default {default}): "
                         f"{help_text}")
        return "\n".join(lines)


def type_name(annotation: Any) -> str:
    """Return a field's type as written: ``float`` whether the annotation is a string or a type.

    A ``Config`` written without ``from __future__ import annotations`` carries the type itself,
    whose ``str`` is ``<class 'float'>``.
    """
    name = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return name.replace(" ", "")


def _coerce(
    owner: str, key: str, value: Any, annotation: Any, error: type[ConfigError]
) -> Any:
    if not isinstance(value, str):
        return value
    kind = type_name(annotation)
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
        raise error(f"{owner} option {key} expects {kind}, got {value!r}") from err
    return value
