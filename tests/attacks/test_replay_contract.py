"""The replay contract is a typed protocol: attacks never probe an observation or its replay.

``Observation.simulate`` is :class:`~fedleak.attacks.replay_contract.Replay` (the harness's
replay, which implements it explicitly) or a plain function; attacks ask ``isinstance`` of the
protocol, never ``getattr``/``hasattr``, so the type checker sees every use.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from fedleak.attacks.replay_contract import Relocatable, Replay
from fedleak.harness.federated.local_update import UpdateSimulator
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from tests.paths import REPO

ATTACKS = REPO / "fedleak" / "attacks"
#: what a getattr/hasattr in the attacks may read: an object's own fields or its config's
OWN = {"self", "config", "self.config"}


#: the one function that reads a Hugging Face model's parts by name (those classes share no
#: typed interface); it reads the public model the server sent, never an observation
MODEL_PARTS = ("text/transformer_layout.py", "part")
#: the compiled step's key: a digest of whatever the traced step reads, walked by reflection; it
#: only hashes what it finds and never chooses what an attack does by what an object has
FINGERPRINT = "optimisation/engine/step_fingerprint.py"


def probes(path: Path) -> list[str]:
    """``file:line`` of every getattr/hasattr in ``path`` on anything but an object's own
    fields or its configuration (or inside :data:`MODEL_PARTS`, or in :data:`FINGERPRINT`)."""
    found: list[str] = []
    if path.as_posix().endswith(FINGERPRINT):
        return found
    tree = ast.parse(path.read_text(), str(path))
    allowed: set[int] = set()
    if path.as_posix().endswith(MODEL_PARTS[0]):
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == MODEL_PARTS[1]:
                allowed |= {id(n) for n in ast.walk(fn)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in {"getattr", "hasattr"} and node.args \
                and ast.unparse(node.args[0]) not in OWN and id(node) not in allowed:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_attacks_never_probe_observations_or_replays() -> None:
    found = [p for path in sorted(ATTACKS.rglob("*.py")) for p in probes(path)]
    assert not found, ("attacks probe an observation or a replay by name; use the Replay "
                       "protocol (fedleak/attacks/replay_contract.py):\n" + "\n".join(found))


def test_the_probe_finder_finds_a_probe(tmp_path: Path) -> None:
    module = tmp_path / "probing.py"
    module.write_text("def f(self, observation):\n"
                      "    getattr(self.config, 'weight', 0.0)\n"
                      "    return getattr(observation.simulate, 'restarts', None)\n")
    assert len(probes(module)) == 1


def test_the_harness_replay_implements_the_contract() -> None:
    assert Replay in UpdateSimulator.__mro__  # explicitly, not only by shape
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    simulator = UpdateSimulator(model, dict(model.named_parameters()),
                                dict(model.named_buffers()), Protocol())
    assert isinstance(simulator, Replay)
    assert isinstance(simulator.at(simulator.parameters), Replay)


def test_a_plain_function_is_a_replay_of_nothing_more() -> None:
    def simulate(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [images.sum() * 0]

    assert not isinstance(simulate, Replay)
    assert not isinstance(simulate, Relocatable)


def test_observe_hands_attacks_the_harness_replay() -> None:
    from fedleak.harness.zoo.datasets import DatasetInfo

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    info = DatasetInfo(name="toy", shape=(3, 2, 2), num_classes=3, mean=(0.5,) * 3,
                       std=(0.5,) * 3, class_names=("a", "b", "c"))
    observation = observe(model, torch.rand(2, 3, 2, 2), torch.tensor([0, 1]), info)
    assert isinstance(observation.simulate, Replay)


def test_observations_look_tensors_up_by_name() -> None:
    from fedleak.harness.zoo.datasets import DatasetInfo

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    info = DatasetInfo(name="toy", shape=(3, 2, 2), num_classes=3, mean=(0.5,) * 3,
                       std=(0.5,) * 3, class_names=("a", "b", "c"))
    observation = observe(model, torch.rand(2, 3, 2, 2), torch.tensor([0, 1]), info)
    assert observation.index_of("1.bias") == 1
    assert observation.parameter("1.weight") is observation.parameters[0]
    assert torch.equal(observation.gradient("1.bias"), observation.gradient_direction()[1])
    assert list(observation.named_parameters()) == ["1.weight", "1.bias"]
    delta = dataclasses.replace(observation, update_kind="delta")
    assert torch.equal(delta.gradient("1.weight"), delta.gradient_direction()[0])
    with pytest.raises(KeyError, match="no parameter 'fc.weight'"):
        observation.parameter("fc.weight")
