"""The plug-ins the docs show, copied verbatim from the pages (neither has
``from __future__ import annotations``), installed as pip lays a package out and audited: their
options arrive as their fields' types, and the audit judges them by their declarations."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.paths import REPO

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
ENTRY = re.compile(r'^([\w-]+) = "([\w.]+:\w+)"$', re.M)


def _block(page: str, first_line: str) -> str:
    """The first ``python`` block of ``page`` whose first line is ``first_line``."""
    for kind, text in FENCE.findall((REPO / page).read_text()):
        if kind == "python" and text.splitlines()[0].strip() == first_line:
            return text
    raise AssertionError(f"{page} shows no python block starting {first_line!r}")


def _entry_points(page: str) -> str:
    """The page's ``[project.entry-points."fedleak.defenses"]`` lines, as entry_points.txt."""
    for kind, text in FENCE.findall((REPO / page).read_text()):
        if kind == "toml" and "fedleak.defenses" in text:
            return "[fedleak.defenses]\n" + "\n".join(
                f"{name} = {target}" for name, target in ENTRY.findall(text)) + "\n"
    raise AssertionError(f"{page} shows no fedleak.defenses entry point")


def _install(root: Path, module: str, source: str, entry_points: str) -> None:
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def docs_plugins(tmp_path: Path) -> Iterator[Path]:
    source = _block("docs/defenses.md", "# fedleak_update_scaling.py")
    assert "from __future__" not in source
    _install(tmp_path, "fedleak_update_scaling", source, _entry_points("docs/defenses.md"))
    tutorial = _block("docs/tutorials/audit-your-defense.md",
                      "# my_defense/fedleak_my_noise.py")
    assert "from __future__" not in tutorial
    _install(tmp_path, "fedleak_my_noise", tutorial,
             "[fedleak.defenses]\nmy-noise = fedleak_my_noise:MyNoise\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("fedleak_update_scaling", "fedleak_my_noise"):
            sys.modules.pop(name, None)


def _victim(defense: str):  # type: ignore[no-untyped-def]
    from fedleak.harness.victim.limits import VictimLimits
    from fedleak.harness.victim.settings import VictimSettings, create_victim

    return create_victim(VictimSettings(
        dataset="digits", model="mlp:width=16", split="all", images="0-7", batch_size=8,
        defenses=(defense,), defense_seed=3, audit=True,
        limits=VictimLimits(max_audit_trials=5000)))


def test_the_defenses_page_plugin_gets_a_float_and_is_audited(docs_plugins: Path) -> None:
    from fedleak.defenses.defense_registry import DEFENSES as DEFENSE_REGISTRY
    from fedleak.harness.victim.audit.request import AuditRequest

    config = DEFENSE_REGISTRY.config("update-scaling", {"factor": "0.25"})
    assert isinstance(config.factor, float) and config.factor == 0.25
    victim = _victim("update-scaling:factor=0.25")
    params, buffers = victim.global_model()
    session = victim.begin_audit(params, buffers, None, AuditRequest(trials=40))
    done, _, _ = victim.run_audit_trials(session.audit_id, 40)
    outcome = victim.submit_audit_scores(session.audit_id, [0.0] * len(done))
    assert not outcome.violation and "no claim to test" in outcome.verdict


def test_the_tutorial_plugin_gets_floats_and_its_audit_finds_no_violation(
        docs_plugins: Path) -> None:
    from fedleak.defenses.defense_registry import DEFENSES as DEFENSE_REGISTRY
    from fedleak.harness.victim.audit.request import AuditRequest

    config = DEFENSE_REGISTRY.config("my-noise", {"clip-norm": "2", "sigma": "0.5"})
    assert isinstance(config.clip_norm, float) and isinstance(config.sigma, float)
    victim = _victim("my-noise:clip-norm=2,sigma=0.5")
    params, buffers = victim.global_model()
    session = victim.begin_audit(params, buffers, None, AuditRequest(trials=128))
    unit = torch.cat([u.flatten().double() for u in session.canary.unit])
    scores: list[float] = []
    while session.left:
        done, _, _ = victim.run_audit_trials(session.audit_id, 256)
        scores += [session.canary.score_sign * float(torch.cat(
            [u.flatten().double() for u in update]) @ unit) for _, update in done]
    outcome = victim.submit_audit_scores(session.audit_id, scores)
    assert not outcome.violation, outcome.verdict
    assert "audited as a run of 128 consecutive releases" in outcome.verdict
