"""DLG (euclidean gradient matching with L-BFGS) recovers tiny images and survives divergence."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedleak.attacks import AttackConfigError, create_attack
from fedleak.attacks.optimisation.presets.dlg import gradient_distance
from fedleak.attacks.optimisation.presets.inverting_gradients import gaussian_init
from fedleak.harness.metrics.image_metrics import psnr_per_image
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation, to_unit

SHAPE = (3, 8, 8)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread is as fast, and immune to OpenMP barriers on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return smooth_image(SHAPE)


def _distance(observation, images: torch.Tensor, labels: torch.Tensor) -> float:
    leaf = images.detach().clone().requires_grad_(True)
    return gradient_distance(observation.simulate(leaf, labels), observation.update).item()


@pytest.mark.parametrize("model", ["lenet-zhu", "mlp:width=64,depth=1"])
def test_dlg_recovers_a_tiny_image(model: str, image: torch.Tensor):
    observation = make_observation(model, SHAPE, 10, image, torch.tensor([6]))
    # L-BFGS on DLG's objective stalls from some inits (hence the paper's 8-16 restarts).
    attack = create_attack("dlg", {"iterations": 50, "restarts": 3})
    result = attack.reconstruct(observation, seed=0)
    start = gaussian_init((1, *SHAPE), 0, torch.device("cpu"))
    assert result.labels.tolist() == [6]
    assert result.objective < 1e-4 * _distance(observation, start, result.labels)
    assert result.objective == pytest.approx(_distance(observation, result.images, result.labels),
                                             rel=1e-3, abs=1e-9)
    psnr = psnr_per_image(to_unit(observation, result.images).clamp(0, 1), image).item()
    assert psnr > 40.0
    assert all(p.grad is None for p in observation.simulate.parameters.values())


def test_divergence_keeps_the_best_finite_iterate(image: torch.Tensor):
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([1]))
    calls = 0

    def diverging(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        nonlocal calls
        calls += 1
        update = observation.simulate(images, labels)
        return [u * math.nan for u in update] if calls > 12 else update

    attack = create_attack("dlg", {"iterations": 20})
    result = attack.reconstruct(dataclasses.replace(observation, simulate=diverging), seed=0)
    assert calls < 20 * 20  # the trial stopped at the first non-finite objective
    assert torch.isfinite(result.images).all()
    assert math.isfinite(result.objective)
    start = gaussian_init((1, *SHAPE), 0, torch.device("cpu"))
    assert result.objective < _distance(observation, start, result.labels)
    assert result.objective == pytest.approx(_distance(observation, result.images, result.labels))


def test_dlg_options_are_checked():
    with pytest.raises(AttackConfigError, match="inner.iterations"):
        create_attack("dlg", {"max_iters": 3})
    with pytest.raises(ValueError, match="line_search"):
        create_attack("dlg", {"line_search": "armijo"})


def test_the_graph_safe_closure_matches_the_eager_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluation a CUDA graph captures (objective and gradient into static buffers,
    copied out for L-BFGS) gives the eager trial's result on the CPU."""
    import fedleak.attacks.optimisation.composed as composed

    shape = (1, 8, 8)
    observation = make_observation("lenet-zhu", shape, 10, torch.rand(1, *shape),
                                   torch.tensor([4]), seed=1)
    options = {"iterations": 6, "restarts": 2, "inner_iterations": 5, "log_every": 2}
    results = {}
    for graph_safe in (False, True):
        monkeypatch.setattr(composed, "capturable", lambda _device, on=graph_safe: on)
        results[graph_safe] = create_attack("dlg", options).reconstruct(observation, seed=3)
    assert results[True].extras["captured"] and not results[False].extras["captured"]
    assert torch.equal(results[True].images, results[False].images)
    assert results[True].restart_objectives == results[False].restart_objectives
