"""Defenses inside a real victim process: published by Describe, applied before the update
leaves, privacy spent reported per round; bad specs refused at start."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.described import server_model
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.integration
TOKEN = "defense-token"
BASE = ["--dataset", "digits", "--split", "all", "--images", "0-15", "--model",
        "mlp:width=32,depth=1", "--batch-size", "4", "--allow-reveal"]


def _clean_update(client: VictimClient, round_id: str, params: dict, buffers: dict) -> list:
    truth, labels = client.reveal(round_id)
    info = load_dataset("digits", "all").info
    model = build_model("mlp:width=32,depth=1", (1, 8, 8), 10)
    return local_update(model, params, buffers, normalize(truth, info), labels, Protocol())


def test_dpsgd_victim_reports_epsilon_and_an_opacus_model() -> None:
    args = [*BASE, "--model", "convnet:width=4", "--defense",
            "dpsgd:noise-multiplier=1.0,max-grad-norm=1.0,poisson=true", "--protocol", "fedavg",
            "--local-epochs", "1", "--local-batch-size", "2", "--lr", "0.1"]
    with VictimProcess(args, token=TOKEN) as victim, VictimClient(victim.address,
                                                                  token=TOKEN) as client:
        described = client.describe()
        assert [(d.name, d.stage) for d in described.defenses] == [("dpsgd", "per-example")]
        assert described.defenses[0].params["noise-multiplier"] == "1.0"
        assert described.model.options["opacus"] == "true"
        model = server_model(described)  # the attacker can build the fixed architecture
        assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
        params, buffers = client.global_model()
        first = client.compute_update(params, buffers)
        second = client.compute_update(params, buffers)
        eps1, eps2 = (float(r.metadata["epsilon_total"]) for r in (first, second))
        assert 0 < eps1 < eps2 and first.metadata["sample_rate"] == "0.5"
        assert float(second.metadata["epsilon_round"]) == pytest.approx(eps1)
        assert first.metadata["dp_steps"] == "2"


def test_clip_and_prune_act_before_the_update_leaves() -> None:
    args = [*BASE, "--defense", "clip:max-norm=0.05", "--defense", "prune:p=0.9,scope=global"]
    with VictimProcess(args, token=TOKEN) as victim, VictimClient(victim.address,
                                                                  token=TOKEN) as client:
        assert [d.name for d in client.describe().defenses] == ["clip", "prune"]
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        flat = torch.cat([u.flatten() for u in got.update])
        assert float(flat.norm()) <= 0.05 + 1e-6
        assert float((flat == 0).float().mean()) == pytest.approx(0.9, abs=0.002)
        clean = torch.cat([u.flatten() for u in _clean_update(client, got.round_id, params,
                                                              buffers)])
        kept = flat != 0
        assert clean[kept].abs().min() >= clean[~kept].abs().max()


def test_noise_has_the_published_scale() -> None:
    with VictimProcess([*BASE, "--defense", "noise:sigma=0.2"], token=TOKEN) as victim, \
            VictimClient(victim.address, token=TOKEN) as client:
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        clean = _clean_update(client, got.round_id, params, buffers)
        residual = torch.cat([(a - b).flatten() for a, b in zip(got.update, clean, strict=True)])
        assert float(residual.std()) == pytest.approx(0.2, rel=0.05)
        assert float(residual.mean()) == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize(
    "spec, words",
    [("soteria", ["unknown defense", "dpsgd", "prune"]),
     ("prune:ratio=0.5", ["no option", "valid: p, scope"]),
     ("noise:sigma=-1", ["sigma must be >= 0"])],
)
def test_bad_defense_specs_are_refused_at_start(spec: str, words: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "fedleak", "victim", "serve", "--port", "0",
                           "--defense", spec], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 2
    for word in words:
        assert word in done.stderr


def test_observe_runs_the_victims_defended_path() -> None:
    """The notebook entry point and a victim process give the same defended update."""
    from fedleak.defenses import build_chain, parse_defense_spec
    from fedleak.harness.federated.observe import observe

    specs = ["clip:max-norm=0.5", "noise:sigma=0.01"]
    args = [*BASE, "--defense-seed", "7", *(a for s in specs for a in ("--defense", s))]
    with VictimProcess(args, token=TOKEN) as victim, VictimClient(victim.address,
                                                                  token=TOKEN) as client:
        params, buffers = client.global_model()
        sent = client.compute_update(params, buffers)
        truth, labels = client.reveal(sent.round_id)
    info = load_dataset("digits", "all").info
    model = build_model("mlp:width=32,depth=1", info.shape, info.num_classes)
    model.load_state_dict({**params, **buffers})
    chain = build_chain([parse_defense_spec(s) for s in specs])
    observation = observe(model, truth, labels, info, Protocol(), defenses=chain,
                          generator=torch.Generator().manual_seed(7))
    assert observation.num_images == 4 and observation.update_kind == "gradient"
    for ours, theirs in zip(observation.update, sent.update, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
