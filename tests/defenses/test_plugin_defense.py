"""A third-party defense through the ``fedleak.defenses`` entry point, across processes.

``tests/test_plugin_package`` is what installing a package leaves on the path: a module and its
``*.dist-info`` with ``entry_points.txt``. Put on ``PYTHONPATH`` of a victim process, its
``update-scaling`` defense is usable by name and published by Describe, with no change to
fedleak; its ``broken-plugin`` entry point names a missing class and is refused clearly.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fedleak.defenses import DefenseConfigError, UpdateDefense
from fedleak.defenses.defense_registry import ENTRY_POINT_GROUP
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.victim.process import VictimProcess
from fedleak.registry import Registry
from tests.helpers import revealed_clean_update
from tests.paths import TESTS

PLUGIN_DIR = TESTS / "test_plugin_package"
MODEL = "mlp:width=32,depth=1"
TOKEN = "plugin-token"


def _plugin_env() -> dict[str, str]:
    paths = [str(PLUGIN_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def test_the_registry_loads_the_plugin_and_reports_a_broken_one(monkeypatch) -> None:
    fresh = Registry("defense", ENTRY_POINT_GROUP, DefenseConfigError)
    assert "update-scaling" not in fresh.names()
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    assert "update-scaling" in fresh.names() and "broken-plugin" not in fresh.names()
    defense = fresh.create("update-scaling", {"factor": "0.25"})
    assert isinstance(defense, UpdateDefense) and defense.name == "update-scaling"
    assert torch.equal(defense.apply([torch.ones(3)], torch.Generator())[0],
                       torch.full((3,), 0.25))
    with pytest.raises(DefenseConfigError) as err:
        fresh.get("broken-plugin")
    for words in ("defense plug-in 'broken-plugin'", "fedleak_update_scaling:NoSuchDefense",
                  "package fedleak-update-scaling", "failed to load: AttributeError"):
        assert words in str(err.value)


@pytest.mark.integration
def test_a_victim_process_uses_and_publishes_the_plugin() -> None:
    args = ["--dataset", "digits", "--split", "all", "--images", "0-7", "--model", MODEL,
            "--batch-size", "4", "--allow-reveal", "--defense", "update-scaling:factor=0.25"]
    with VictimProcess(args, token=TOKEN, env=_plugin_env()) as victim, \
            VictimClient(victim.address, token=TOKEN, timeout=60) as client:
        (spec,) = client.describe().defenses
        assert (spec.name, dict(spec.params), spec.stage) == \
            ("update-scaling", {"factor": "0.25"}, "update")
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        clean = revealed_clean_update(client, got.round_id, params, buffers, MODEL)
    for received, sent in zip(got.update, clean, strict=True):
        assert torch.allclose(received, 0.25 * sent, rtol=1e-5, atol=1e-8)


@pytest.mark.integration
def test_a_broken_plugin_is_refused_at_start_naming_it() -> None:
    done = subprocess.run([sys.executable, "-m", "fedleak", "victim", "serve", "--port", "0",
                           "--defense", "broken-plugin"], capture_output=True, text=True,
                          timeout=1200, env={**os.environ, **_plugin_env()})
    assert done.returncode == 2
    assert "defense plug-in 'broken-plugin'" in done.stderr
    assert "failed to load" in done.stderr
