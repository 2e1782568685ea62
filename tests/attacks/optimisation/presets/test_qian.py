"""Qian & Hansen's Algorithm 2: regularisers on constructed inputs, λ decay, U(0,1) init, and that
the optimisation lowers the gradient distance on a tiny model."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks import AttackConfigError, create_attack
from fedleak.attacks.optimisation.presets.dlg import gradient_distance
from fedleak.attacks.optimisation.presets.qian import (
    Qian,
    l2_regularizer,
    orthogonality_regularizer,
    regularizer_weight,
    uniform_init,
)
from tests.helpers import make_observation, to_unit


def test_l2_regularizer_is_the_squared_frobenius_norm() -> None:
    images = torch.tensor([[[[1.0, -2.0], [0.0, 3.0]]]])
    assert l2_regularizer(images).item() == pytest.approx(14.0)


def test_orthogonality_regularizer_on_constructed_batches() -> None:
    e1 = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 2, 2)
    e2 = torch.tensor([0.0, 1.0, 0.0, 0.0]).view(1, 1, 2, 2)
    assert orthogonality_regularizer(torch.cat([e1, e2])).item() == 0.0
    ones = torch.ones(1, 1, 2, 2)
    # x1ᵀx2 = 4 for each of the 2 ordered pairs: 2 · 4² = 32; the diagonal does not count
    assert orthogonality_regularizer(torch.cat([ones, ones])).item() == pytest.approx(32.0)
    three = torch.cat([ones, 2 * e1, e2])  # pairs: (1,2)=2, (1,3)=1, (2,3)=0
    assert orthogonality_regularizer(three).item() == pytest.approx(2 * (4 + 1 + 0))
    assert orthogonality_regularizer(ones).item() == 0.0


def test_weight_decays_by_0_9_every_m_iterations() -> None:
    assert regularizer_weight(0, 1.0, 0.9, 100) == 1.0
    assert regularizer_weight(99, 1.0, 0.9, 100) == 1.0
    assert regularizer_weight(100, 1.0, 0.9, 100) == pytest.approx(0.9)
    assert regularizer_weight(250, 2.0, 0.9, 100) == pytest.approx(2 * 0.81)


def test_init_is_uniform_on_the_pixel_box() -> None:
    observation = make_observation("mlp:width=8", (1, 6, 6), 10, torch.rand(2, 1, 6, 6),
                                   torch.tensor([0, 1]))
    images = to_unit(observation, uniform_init(observation, 3, torch.device("cpu")))
    assert images.shape == (2, 1, 6, 6)
    assert images.min() >= 0 and images.max() <= 1 and 0.35 < images.mean() < 0.65
    assert torch.equal(images, to_unit(observation, uniform_init(observation, 3, "cpu")))


def test_objective_adds_the_decayed_regularizer() -> None:
    observation = make_observation("mlp:width=8", (1, 4, 4), 10, torch.rand(2, 1, 4, 4),
                                   torch.tensor([2, 5]))
    attack = Qian(Qian.Config(weight=0.5, decay_every=10))
    images = torch.rand(2, 1, 4, 4)
    labels = torch.tensor([2, 5])
    (prior,) = attack.bind_priors(observation)
    assert prior.part.name == "qian" and prior.weight(25, 2000) == pytest.approx(0.5 * 0.81)
    pixels = images * 0.5 + 0.5  # R acts on the [0, 1] pixel scale (helpers: mean = std = 0.5)
    expected = orthogonality_regularizer(pixels)
    assert prior.single(images).item() == pytest.approx(expected.item(), rel=1e-6)
    assert labels.tolist() == [2, 5]
    assert attack.regularizer_name(1) == "l2" and attack.regularizer_name(2) == "orthogonality"


@pytest.mark.parametrize(("model", "n"), [("lenet-zhu", 1), ("mlp:width=16", 2)])
def test_attack_lowers_the_gradient_distance(model: str, n: int) -> None:
    shape = (1, 8, 8)
    labels = torch.tensor([3, 7][:n])
    observation = make_observation(model, shape, 10, torch.rand(n, *shape), labels, seed=1)
    start = uniform_init(observation, 0, torch.device("cpu")).requires_grad_(True)
    before = gradient_distance(observation.simulate(start, labels), observation.update).item()
    result = create_attack("qian", {"iterations": 60, "lr": 0.05}).reconstruct(observation)
    assert result.objective < 0.5 * before
    assert sorted(result.labels.tolist()) == sorted(labels.tolist())
    assert result.extras["regularizer"] == ("l2" if n == 1 else "orthogonality")
    assert result.images.shape == (n, *shape) and torch.isfinite(result.images).all()


def test_bad_options_are_refused() -> None:
    for options in ({"regularizer": "tv"}, {"decay": "1.5"}, {"decay_every": "0"},
                    {"optimizer": "lbfgs"}, {"weight": "-1"}):
        with pytest.raises(AttackConfigError):
            create_attack("qian", options)


@pytest.mark.parametrize(("n", "options"), [
    (1, {"optimizer": "adam", "lr": 0.05}),
    (2, {"optimizer": "sgd", "lr": 0.01, "weight": 1e-3, "decay_every": 7}),
    (1, {"optimizer": "sgd", "lr": 1e8}),  # diverges: both keep the last finite iterate
])
def test_the_graph_safe_step_matches_the_eager_loop(monkeypatch: pytest.MonkeyPatch, n: int,
                                                    options: dict) -> None:
    """The step a CUDA graph captures (device-side λ schedule, optimiser state and stop flag)
    gives the eager loop's result on the CPU, divergence included."""
    import fedleak.attacks.optimisation.composed as composed

    shape = (1, 8, 8)
    observation = make_observation("lenet-zhu", shape, 10, torch.rand(n, *shape),
                                   torch.tensor([3, 7][:n]), seed=1)
    options = {**options, "iterations": 30, "restarts": 2, "log_every": 4}
    calls: dict[bool, list[tuple[int, int, float]]] = {False: [], True: []}
    results = {}
    for graph_safe in (False, True):
        monkeypatch.setattr(composed, "capturable", lambda _device, on=graph_safe: on)
        results[graph_safe] = create_attack("qian", options).reconstruct(
            observation, seed=2, progress=lambda *call, g=graph_safe: calls[g].append(call))
    eager, graph_safe = results[False], results[True]
    assert graph_safe.extras["captured"] and not eager.extras["captured"]
    torch.testing.assert_close(graph_safe.images, eager.images, rtol=1e-5, atol=1e-4)
    assert graph_safe.restart_objectives == pytest.approx(eager.restart_objectives, rel=1e-3)
    assert [c[:2] for c in calls[True]] == [c[:2] for c in calls[False]]
