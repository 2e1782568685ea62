"""Defenses in-process: each does what its maths says, and DP-SGD's ε is Opacus's."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from fedleak.defenses import (
    DefenseConfigError,
    build_chain,
    create_defense,
    parse_defense_spec,
)
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.private_update import private_local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.settings import load_defense_file
from fedleak.harness.zoo.models import build_model


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_clip_bounds_the_whole_update_norm() -> None:
    update = [torch.full((10,), 3.0), torch.full((5, 2), 4.0)]
    clipped = create_defense("clip", {"max_norm": "2"}).apply(update, gen())
    assert float(torch.sqrt(sum((u ** 2).sum() for u in clipped))) == pytest.approx(2.0)
    small = [torch.full((3,), 0.1)]
    assert torch.equal(create_defense("clip", {"max_norm": 5}).apply(small, gen())[0], small[0])


@pytest.mark.parametrize("distribution, std_factor", [("gaussian", 1.0), ("laplace", math.sqrt(2))])
def test_noise_has_the_stated_scale(distribution: str, std_factor: float) -> None:
    update = [torch.zeros(200_000)]
    noisy = create_defense("noise", {"sigma": 0.3, "distribution": distribution}).apply(update,
                                                                                        gen())
    assert float(noisy[0].mean()) == pytest.approx(0.0, abs=0.005)
    assert float(noisy[0].std()) == pytest.approx(0.3 * std_factor, rel=0.02)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_prune_keeps_the_largest_entries(scope: str) -> None:
    update = [torch.randn(1000, generator=gen(1)), 10 * torch.randn(500, generator=gen(2))]
    pruned = create_defense("prune", {"p": 0.9, "scope": scope}).apply(update, gen())
    kept = sum(int((u != 0).sum()) for u in pruned)
    assert kept == 150
    flat_in, flat_out = torch.cat(update), torch.cat(pruned)
    threshold = flat_in[flat_out != 0].abs().min()
    if scope == "global":
        assert (flat_in[flat_out == 0].abs() <= threshold).all()
        assert int((pruned[1] != 0).sum()) > int((pruned[0] != 0).sum())
    else:
        assert int((pruned[0] != 0).sum()) == 100 and int((pruned[1] != 0).sum()) == 50


def test_quantize_is_unbiased_and_coarse() -> None:
    update = [torch.linspace(-1, 1, 50)]
    quantize = create_defense("quantize", {"bits": 3})
    draws = torch.stack([quantize.apply(update, gen(s))[0] for s in range(2000)])
    assert draws[0].unique().numel() <= 7
    torch.testing.assert_close(draws.mean(0), update[0], atol=0.03, rtol=0)


def test_dpsgd_clips_each_example_then_averages() -> None:
    dp = create_defense("dpsgd", {"noise_multiplier": 0, "max_grad_norm": 1.0})
    per_example = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]  # norms 5 and 0.5
    out = dp.privatise(per_example, 2, gen())
    torch.testing.assert_close(out[0], torch.tensor([(0.6 + 0.3) / 2, (0.8 + 0.4) / 2]))
    per_layer = create_defense("dpsgd", {"noise_multiplier": 0, "clipping": "per-layer",
                                          "max_grad_norm": math.sqrt(2)})
    layers = [torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 10.0]])]
    out = per_layer.privatise(layers, 1, gen())
    assert [float(o.norm()) for o in out] == pytest.approx([1.0, 1.0])


def test_dpsgd_noise_has_scale_sigma_c_over_batch() -> None:
    dp = create_defense("dpsgd", {"noise_multiplier": 2.0, "max_grad_norm": 0.5})
    out = dp.privatise([torch.zeros(4, 100_000)], 4, gen())
    assert float(out[0].std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.02)


@pytest.mark.parametrize("kind, cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_dpsgd_epsilon_is_opacus_accountant(kind: str, cls: type) -> None:
    dp = create_defense("dpsgd", {"noise_multiplier": 1.1, "accountant": kind, "delta": 1e-5})
    first = dp.account(steps=20, sample_rate=0.25)
    second = dp.account(steps=20, sample_rate=0.25)
    reference = cls()
    for _ in range(20):
        reference.step(noise_multiplier=1.1, sample_rate=0.25)
    assert float(first["epsilon_round"]) == pytest.approx(reference.get_epsilon(delta=1e-5),
                                                          rel=1e-3)
    for _ in range(20):
        reference.step(noise_multiplier=1.1, sample_rate=0.25)
    assert float(second["epsilon_total"]) == pytest.approx(reference.get_epsilon(delta=1e-5),
                                                           rel=1e-3)
    assert float(second["epsilon_round"]) == pytest.approx(float(first["epsilon_round"]))


def test_dpsgd_without_noise_or_clipping_is_the_plain_update() -> None:
    model = build_model("lenet-zhu", (3, 16, 16), 4)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    x, y = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    dp = create_defense("dpsgd", {"noise_multiplier": 0, "max_grad_norm": 1e9})
    for protocol in (Protocol(), Protocol("fedavg", 2, 2, 0.1)):
        private = private_local_update(model, params, buffers, x, y, protocol, dp, gen())
        plain = local_update(model, params, buffers, x, y, protocol)
        for a, b in zip(private.update, plain, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert private.steps == 4 and private.sample_rate == 0.5


def test_poisson_sampling_runs_one_over_q_steps_per_epoch() -> None:
    model = build_model("mlp:width=8,depth=1", (1, 4, 4), 3)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    x, y = torch.rand(8, 1, 4, 4), torch.randint(0, 3, (8,))
    dp = create_defense("dpsgd", {"noise_multiplier": 1.0, "poisson": True})
    private = private_local_update(model, params, buffers, x, y, Protocol("fedavg", 3, 2, 0.1),
                                   dp, gen())
    assert private.steps == 12 and private.sample_rate == 0.25


def test_chain_specs_files_and_errors(tmp_path) -> None:
    path = tmp_path / "defenses.toml"
    path.write_text('[[defense]]\nname = "dpsgd"\nnoise_multiplier = 0.5\n\n'
                    '[[defense]]\nname = "prune"\np = 0.5\n')
    chain = build_chain(load_defense_file(path) + [parse_defense_spec("noise:sigma=0.1")])
    assert chain.per_example is not None and [d.name for d in chain.update] == ["prune", "noise"]
    declared = chain.per_example.declared()
    assert declared is not None
    assert chain.describe()[0] == ("dpsgd", {**chain.per_example.public_params(),
                                             **declared.to_params()}, "per-example")
    with pytest.raises(DefenseConfigError, match="choose one of client-dp, clip, dpsgd"):
        build_chain([parse_defense_spec("soteria")])
    with pytest.raises(DefenseConfigError, match="valid: p, scope"):
        build_chain([parse_defense_spec("prune:ratio=0.5")])
    with pytest.raises(DefenseConfigError, match="expects float"):
        build_chain([parse_defense_spec("noise:sigma=lots")])
    with pytest.raises(DefenseConfigError, match="at most one per-example"):
        build_chain([("dpsgd", {}), ("dpsgd", {})])
    with pytest.raises(DefenseConfigError, match="key=value"):
        parse_defense_spec("prune:0.5")
