"""Client-level DP (DP-FedAvg, McMahan et al. 2018): the user's whole update clipped to S with
N(0, σ²S²) added — by the user (local) or in shares under secure aggregation (distributed) —
and an accountant over rounds and the user sampling rate that is Opacus's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from fedleak.defenses import DefenseConfigError, build_chain, create_defense
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.secagg_rounds import run_secagg
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_whole_update_is_clipped_to_s_then_noised_with_sigma_s() -> None:
    update = [torch.full((300,), 3.0), torch.full((10, 10), -4.0)]
    quiet = create_defense("client-dp", {"clip_norm": 2.0, "noise_multiplier": 0.0})
    clipped = quiet.apply(update, gen())
    assert float(torch.cat([u.flatten() for u in clipped]).norm()) == pytest.approx(2.0)
    assert float(clipped[0][0] / clipped[1][0, 0]) == pytest.approx(-0.75)  # direction kept
    noisy = create_defense("client-dp", {"clip_norm": 0.5, "noise_multiplier": 3.0})
    out = noisy.apply([torch.zeros(200_000)], gen())
    assert float(out[0].std()) == pytest.approx(1.5, rel=0.02)
    assert float(out[0].mean()) == pytest.approx(0.0, abs=0.02)


def test_distributed_shares_sum_to_sigma_s_and_need_secagg() -> None:
    with pytest.raises(DefenseConfigError, match="add --defense secagg"):
        build_chain([("client-dp", {"variant": "distributed"})])
    chain = build_chain([("client-dp", {"variant": "distributed", "noise_multiplier": 2.0,
                                        "clip_norm": 0.5}), ("secagg", {})])
    dp = chain.update[0]
    dp.bind_users(4)
    shares = [dp.apply([torch.zeros(100_000)], gen(s))[0] for s in range(4)]
    assert float(shares[0].std()) == pytest.approx(2.0 * 0.5 / 2, rel=0.02)
    assert float(sum(shares).std()) == pytest.approx(2.0 * 0.5, rel=0.02)
    fixed = create_defense("client-dp", {"variant": "distributed", "users": 16})
    fixed.bind_users(4)  # an explicit n is kept
    claim = fixed.gaussian_claim()
    assert claim.clip_norm == 1.0 and claim.noise_std == pytest.approx(0.25)


@pytest.mark.parametrize("kind, cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_accountant_is_opacus_over_rounds_and_user_sampling(kind: str, cls: type) -> None:
    central = create_defense("client-dp", {"variant": "distributed", "noise_multiplier": 1.1,
                                           "user_sample_rate": 0.1, "accountant": kind})
    local = create_defense("client-dp", {"noise_multiplier": 1.1, "accountant": kind})
    for _ in range(3):
        central.account_round()
        local.account_round()
    last, mine = central.account_round(), local.account_round()
    reference, replaced = cls(), cls()
    reference.history.append((1.1, 0.1, 4))
    replaced.history.append((1.1 / 2, 1.0, 4))  # local: replace-one, no amplification
    assert float(last["epsilon_total"]) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-3)
    assert float(mine["epsilon_total"]) == pytest.approx(replaced.get_epsilon(1e-5), rel=1e-3)
    assert last["dp_rounds"] == "4" and last["privacy_unit"] == "user"
    assert float(last["epsilon_round"]) < float(last["epsilon_total"])


def test_bad_settings_name_what_to_change() -> None:
    for params, text in [({"clip_norm": 0}, "clip-norm"), ({"variant": "central"}, "variant"),
                         ({"user_sample_rate": 0}, "user-sample-rate"), ({"users": -1}, "users"),
                         ({"accountant": "moments"}, "accountant")]:
        with pytest.raises(DefenseConfigError, match=text):
            create_defense("client-dp", params)


MODEL = "mlp:width=16,depth=1"


@pytest.mark.integration
def test_secagg_sum_carries_sigma_s_noise_over_the_wire() -> None:
    """Four users each add a quarter of the variance; the unmasked sum is Σ clip(Δ_u) plus
    noise of std σS, and the victim reports one round of ε per user."""
    s, sigma = 0.1, 0.5
    args = ["--dataset", "digits", "--split", "all", "--images", "0-7", "--model", MODEL,
            "--batch-size", "2", "--users", "4", "--allow-reveal", "--defense-seed", "3",
            "--defense", f"client-dp:variant=distributed,clip-norm={s},noise-multiplier={sigma}",
            "--defense", "secagg:threshold=3,clip=5"]
    with VictimProcess(args, token="dp") as victim, VictimClient(victim.address,
                                                                 token="dp") as client:
        params, buffers = client.global_model()
        aggregation = run_secagg(client, params, buffers)
        assert aggregation.begin.metadata["dp_rounds"] == "1"
        truth, labels = client.reveal(aggregation.begin.round_id)
    info = load_dataset("digits", "all").info
    model = build_model(MODEL, (1, 8, 8), 10)
    clipped = []
    for u in range(4):
        part = slice(2 * u, 2 * u + 2)
        flat = torch.cat([t.flatten() for t in local_update(
            model, params, buffers, normalize(truth[part], info), labels[part], Protocol())])
        clipped.append(flat.double().numpy() * min(1.0, s / float(flat.norm())))
    residual = aggregation.result.total - np.sum(clipped, axis=0)
    assert float(residual.std()) == pytest.approx(sigma * s, rel=0.08)
    assert abs(float(residual.mean())) < 0.01
