"""examples/attack_plugin, the attack docs/how-to/write-an-attack.md walks through: laid out as
pip installs a package, it registers through the ``fedleak.attacks`` entry point and recovers a
digit from an update (in-process, through a fresh registry, so no other test sees it)."""

from __future__ import annotations

import torch

from fedleak.attacks import AttackConfigError
from fedleak.attacks.attack_registry import ENTRY_POINT_GROUP
from fedleak.registry import Registry
from tests.helpers import make_observation
from tests.paths import REPO

PLUGIN_DIR = REPO / "examples" / "attack_plugin"


def test_the_example_attack_plugs_in_and_recovers_a_digit(monkeypatch) -> None:
    fresh = Registry("attack", ENTRY_POINT_GROUP, AttackConfigError)
    assert "cosine-sketch" not in fresh.names()
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    assert "cosine-sketch" in fresh.names()
    attack = fresh.create("cosine-sketch", {"iterations": "200"})
    torch.manual_seed(1)
    image = torch.rand(1, 1, 8, 8)
    observation = make_observation("mlp:width=64,depth=1", (1, 8, 8), 10, image,
                                   torch.tensor([3]))
    result = attack.reconstruct(observation, seed=0)
    assert result.labels.tolist() == [3] and result.iterations == 200
    recovered = result.images * 0.5 + 0.5  # make_observation normalises with 0.5 / 0.5
    assert torch.nn.functional.mse_loss(recovered, image) < 1e-3
