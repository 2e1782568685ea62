"""The name registry behind attacks and defenses: ``key=value`` strings become the Config's
field types whether the Config's module writes its annotations as strings or as types."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Literal, Optional

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


class Shade(enum.Enum):
    LIGHT = "light"
    DARK = "dark"


@dataclasses.dataclass
class RichConfig:  # this module has the future import: the annotations are strings
    limit: int | None = None
    scale: Optional[float] = None  # noqa: UP045  (the Optional spelling, as users write it)
    mode: Literal["sum", "mean"] = "sum"
    shade: Shade = Shade.LIGHT
    flag: bool = True


RichPlain = dataclasses.make_dataclass(  # the same with type objects
    "RichPlain", [("limit", int | None, None), ("scale", Optional[float], None),  # noqa: UP045
                  ("mode", Literal["sum", "mean"], "sum"), ("shade", Shade, Shade.LIGHT),
                  ("flag", bool, True)])


@pytest.mark.parametrize("config", [RichConfig, RichPlain], ids=["strings", "types"])
def test_optional_literal_and_enum_options_get_their_types(config: type) -> None:
    registry: Registry[object] = Registry("thing", "fedleak.no-such-group", ConfigError)

    @registry.register("thing")
    class Thing:
        Config = config

    made = registry.config("thing", {"limit": "8", "scale": "0.5", "mode": "mean",
                                     "shade": "dark", "flag": "false"})
    assert (made.limit, made.scale, made.mode, made.shade, made.flag) == \
        (8, 0.5, "mean", Shade.DARK, False)
    assert isinstance(made.limit, int) and made.flag is False
    none = registry.config("thing", {"limit": "none", "scale": "None"})
    assert none.limit is None and none.scale is None
    with pytest.raises(ConfigError, match="option mode expects one of sum\\|mean, got 'max'"):
        registry.config("thing", {"mode": "max"})
    with pytest.raises(ConfigError, match="option limit expects int\\|None, got '8.5'"):
        registry.config("thing", {"limit": "8.5"})
    with pytest.raises(ConfigError, match="option shade expects one of light\\|dark"):
        registry.config("thing", {"shade": "grey"})
    assert "limit (int|None, default None)" in registry.describe("thing")


def test_the_built_ins_module_is_imported_on_the_first_lookup_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "fedleak_test_builtins.py"
    module.write_text(
        "from tests.test_registry import LAZY, PlainConfig\n"
        "@LAZY.register('late')\n"
        "class Late:\n"
        "    Config = PlainConfig\n"
        "    def __init__(self, config):\n"
        "        self.config = config\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    LAZY.builtins = "fedleak_test_builtins"
    assert "late" not in LAZY._classes  # nothing imported at construction
    assert LAZY.names() == ("late",)
    assert LAZY.builtins is None  # imported once
    assert LAZY.create("late", {"rate": "2"}).config.rate == 2.0  # type: ignore[attr-defined]


LAZY: Registry[object] = Registry("lazy", "fedleak.no-such-group", ConfigError)


def test_a_victim_imports_no_attack_family_and_no_scipy() -> None:
    """Every victim and CLI process pays its imports: the CLI's entry imports no torch (its
    commands do), the attack registry loads the families on its first lookup and the estimators
    (and the attack command's bounds) import scipy inside their functions."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import fedleak.harness.cli.main\n"
            "print(sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules))\n"
            "import fedleak.harness.victim.server\n"
            "import fedleak.harness.victim.settings\n"
            "print(sorted(m for m in ('scipy', 'fedleak.attacks.builtin_attacks',"
            " 'fedleak.attacks.exact.cocktail_party.cpa', 'transformers') if m in sys.modules))\n"
            "from fedleak.attacks import attack_names\n"
            "print('inverting-gradients' in attack_names(), 'dager' in attack_names())\n"
            "print('scipy' in sys.modules)\n"
            "import fedleak.harness.attacker.run\n"
            "print(sorted(m for m in ('scipy', 'sklearn') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True)
    # the attacker's registry loads every family, and still no scipy (only the functions use it)
    # and the attack command's own modules (records, bounds, Clopper-Pearson) neither
    assert done.stdout.split("\n")[:5] == ["[]", "[]", "True True", "False", "[]"], \
        done.stdout + done.stderr
