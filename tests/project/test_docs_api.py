"""The API reference (docs/reference/api/) renders every public attack and defense.

Every registered attack and defense (built-ins and the built-in `remote` entry point) is
defined in a module that an autosummary directive of the API pages names, itself or through a
``:recursive:`` package above it; `make docs` (run by `make test`) then renders its page with
warnings as errors.
"""

from __future__ import annotations

import re

from fedleak.attacks import attack_class, attack_names
from fedleak.defenses.defense_registry import DEFENSES, defense_names
from tests.paths import REPO

API = REPO / "docs" / "reference" / "api"
_DIRECTIVE = re.compile(r"\.\. autosummary::\n((?:   .*\n|\n)+)")


def documented() -> tuple[set[str], set[str]]:
    """Modules the API pages name, and the packages they name with ``:recursive:``."""
    modules: set[str] = set()
    recursive: set[str] = set()
    for page in API.glob("*.md"):
        for block in _DIRECTIVE.findall(page.read_text()):
            names = {line.strip() for line in block.splitlines()
                     if line.strip() and not line.strip().startswith(":")}
            (recursive if ":recursive:" in block else modules).update(names)
    return modules, recursive


def covered(module: str) -> bool:
    modules, recursive = documented()
    return module in modules or any(module == p or module.startswith(p + ".") for p in recursive)


def test_every_registered_attack_has_an_api_page() -> None:
    missing = [attack_class(n).__module__ for n in attack_names()
               if not covered(attack_class(n).__module__)]
    assert not missing, f"attacks defined in modules no API page names: {missing}"


def test_every_registered_defense_has_an_api_page() -> None:
    # fedleak's own defenses (a plug-in another test installed documents itself)
    missing = [DEFENSES.get(n).__module__ for n in defense_names()
               if DEFENSES.get(n).__module__.startswith("fedleak.")
               and not covered(DEFENSES.get(n).__module__)]
    assert not missing, f"defenses defined in modules no API page names: {missing}"


def test_the_flower_bridge_has_a_short_path_and_an_api_page() -> None:
    """``from fedleak.flower import LeakageAudit`` (and every other public Flower name) is
    documented where it is defined, and ``import fedleak.flower`` imports no flwr."""
    import subprocess
    import sys

    import fedleak.flower

    modules, _ = documented()
    assert "fedleak.flower" in modules
    missing = [f"{name} ({fedleak.flower.WHERE[name]})" for name in fedleak.flower.__all__
               if f"fedleak.harness.flower.{fedleak.flower.WHERE[name]}" not in modules]
    assert not missing, "Flower names whose module no API page documents: " + ", ".join(missing)
    quiet = subprocess.run(
        [sys.executable, "-c", "import sys, fedleak, fedleak.flower; "
         "print(any(m == 'flwr' or m.startswith('flwr.') for m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert quiet.stdout.strip() == "False"
    from fedleak.flower import LeakageAudit
    from fedleak.harness.flower.leakage_audit import LeakageAudit as defined
    assert LeakageAudit is defined
