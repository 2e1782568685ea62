"""The name registry behind attacks and defenses: ``key=value`` strings become the Config's
field types whether the Config's module writes its annotations as strings or as types."""

from __future__ import annotations

import dataclasses

import pytest

from fedleak.registry import ConfigError, Registry

# Built without ``from __future__ import annotations``: the fields' types are the classes.
PlainConfig = dataclasses.make_dataclass(
    "PlainConfig", [("rate", float, 1.0), ("count", int, 2), ("on", bool, False),
                    ("name", str, "a")])
StringConfig = dataclasses.make_dataclass(
    "StringConfig", [("rate", "float", 1.0), ("count", "int", 2), ("on", "bool", False),
                     ("name", "str", "a")])


@pytest.mark.parametrize("config", [PlainConfig, StringConfig], ids=["types", "strings"])
def test_options_are_converted_to_the_field_types(config: type) -> None:
    registry: Registry[object] = Registry("thing", "fedleak.no-such-group", ConfigError)

    @registry.register("thing")
    class Thing:
        Config = config

        def __init__(self, cfg: object) -> None:
            self.config = cfg

    made = registry.config("thing", {"rate": "0.5", "count": "3", "on": "true", "name": "b"})
    assert (made.rate, made.count, made.on, made.name) == (0.5, 3, True, "b")
    assert isinstance(made.rate, float) and isinstance(made.count, int)
    with pytest.raises(ConfigError, match="thing 'thing' option count expects int, got 'x'"):
        registry.config("thing", {"count": "x"})
    assert registry.describe("thing").splitlines()[:2] == ["rate (float, default 1.0): ",
                                                           "count (int, default 2): "]
