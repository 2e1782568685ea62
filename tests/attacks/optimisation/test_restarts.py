"""Vectorised restarts: the batched replay and attack give every restart the sequential result."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.optimisation.presets.inverting_gradients import (
    CosineObjective,
    total_variation,
)
from fedleak.attacks.optimisation.restarts import (
    RestartsCosineObjective,
    batched_replay,
    restart_total_variation,
)
from fedleak.harness.federated.local_update import UpdateSimulator, local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.zoo.models import build_model
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation

SHAPE = (3, 8, 8)
FEDAVG = Protocol(kind="fedavg", local_epochs=2, batch_size=1, learning_rate=0.05)
PROTOCOLS = pytest.mark.parametrize("protocol", [Protocol(), FEDAVG], ids=["fedsgd", "fedavg"])


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def two_images() -> torch.Tensor:
    image = smooth_image(SHAPE)
    return torch.cat([image, image.flip(-1).roll(2, dims=1)])


@PROTOCOLS
@pytest.mark.parametrize("model", ["lenet-zhu", "mlp"])
def test_batched_replay_is_the_sequential_replay(model: str, protocol: Protocol):
    torch.manual_seed(0)
    net = build_model(model, SHAPE, 10)
    simulator = UpdateSimulator(net, dict(net.named_parameters()), dict(net.named_buffers()),
                                protocol)
    stacked = torch.randn(3, 2, *SHAPE, requires_grad=True)
    labels = torch.tensor([1, 4])
    batched = simulator.restarts(stacked, labels)
    cotangents = [u.detach().clone() for u in batched]
    (grads,) = torch.autograd.grad(batched, stacked, cotangents)
    for r in range(3):
        x = stacked[r].detach().requires_grad_(True)
        update = simulator(x, labels)
        for one, many in zip(update, batched, strict=True):
            torch.testing.assert_close(many[r], one, rtol=1e-5, atol=1e-6)
        (grad,) = torch.autograd.grad(update, x, [c[r] for c in cotangents])
        torch.testing.assert_close(grads[r], grad, rtol=1e-4, atol=1e-6)


@PROTOCOLS
def test_vectorised_restarts_equal_sequential_ones(protocol: Protocol):
    observation = make_observation("lenet-zhu", SHAPE, 10, two_images(), torch.tensor([3, 5]),
                                   protocol)
    options = {"iterations": 25, "restarts": 3, "tv": 1e-3}
    batched = create_attack("inverting-gradients", options).reconstruct(observation, seed=3)
    one_by_one = create_attack("inverting-gradients", {**options, "vectorised": False})
    sequential = one_by_one.reconstruct(observation, seed=3)
    assert batched.extras["vectorised_restarts"] is True
    assert sequential.extras["vectorised_restarts"] is False
    assert batched.restart_objectives == pytest.approx(sequential.restart_objectives, rel=1e-5)
    assert len(set(batched.restart_objectives)) == 3  # the restarts really differ
    torch.testing.assert_close(batched.images, sequential.images, rtol=0, atol=1e-4)
    assert batched.labels.tolist() == sequential.labels.tolist()


def test_each_restart_keeps_its_own_decayed_step_and_box():
    """lr decay and the box act per restart: restart r of a batched run is the single run r."""
    observation = make_observation("lenet-zhu", SHAPE, 10, smooth_image(SHAPE),
                                   torch.tensor([2]))
    options = {"iterations": 16, "restarts": 2, "lr": 0.5, "tv": 0.0}
    batched = create_attack("inverting-gradients", options).reconstruct(observation, seed=11)
    for r in range(2):
        single = create_attack("inverting-gradients", {**options, "restarts": 1})
        result = single.reconstruct(observation, seed=11 + r)
        assert batched.restart_objectives[r] == pytest.approx(result.objective, rel=1e-5)
    lower, upper = observation.image_bounds()
    assert torch.all(batched.images >= lower) and torch.all(batched.images <= upper)


@PROTOCOLS
def test_training_mode_batchnorm_vectorises_with_correct_derivatives(protocol: Protocol):
    """torch.func's vmapped double backward of training-mode batch norm is wrong (9e-4 relative
    against finite differences in float64); the decomposed replay agrees with them and with
    the sequential replay, so BatchNorm models vectorise their restarts too."""
    torch.manual_seed(1)
    net = build_model("convnet:width=4", SHAPE, 10).double()
    simulator = UpdateSimulator(net, dict(net.named_parameters()), dict(net.named_buffers()),
                                protocol)
    assert simulator.vectorisable
    stacked = torch.randn(2, 2, *SHAPE, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([3, 5])
    cotangents = [torch.randn(2, *p.shape, dtype=torch.float64)
                  for p in simulator.parameters.values()]

    def sequential(x: torch.Tensor, r: int) -> torch.Tensor:
        buffers = {k: v.clone() for k, v in simulator.buffers.items()}
        update = local_update(net, simulator.parameters, buffers, x, labels, protocol, True)
        return sum((u * c[r]).sum() for u, c in zip(update, cotangents, strict=True))

    batched = simulator.restarts(stacked, labels)
    total = sum((u * c).sum() for u, c in zip(batched, cotangents, strict=True))
    (grads,) = torch.autograd.grad(total, stacked)
    direction = torch.randn(2, *SHAPE, dtype=torch.float64)
    for r in range(2):
        x = stacked[r].detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(sequential(x, r), x)
        torch.testing.assert_close(grads[r], grad, rtol=1e-8, atol=1e-10)
        eps = 1e-6
        plus = (x + eps * direction).detach().requires_grad_(True)
        minus = (x - eps * direction).detach().requires_grad_(True)
        finite = (sequential(plus, r) - sequential(minus, r)) / (2 * eps)
        assert float((grads[r] * direction).sum()) == pytest.approx(float(finite), rel=1e-6)


def test_batchnorm_models_vectorise_their_restarts():
    """Batched and one-by-one restarts end at the same objectives. Few iterations on purpose:
    signed Adam turns a float32 rounding difference in a gradient component near zero into a
    full step of the other sign, and the trajectories part. With oneDNN held to AVX2
    (``ONEDNN_MAX_CPU_ISA=AVX2``, as on a CPU without AVX-512) the batched and the single-image
    convolutions round differently: after 25 iterations one restart's final objective moved
    0.3 %; up to 10 iterations all three restarts agree to the last bit there and with the
    default and AVX-512 kernels. The exact equivalence of each step is
    test_training_mode_batchnorm_vectorises_with_correct_derivatives's, in float64."""
    observation = make_observation("convnet:width=4", SHAPE, 10, two_images(),
                                   torch.tensor([1, 2]))
    assert batched_replay(observation) is not None
    options = {"iterations": 5, "restarts": 3, "tv": 1e-3}
    batched = create_attack("inverting-gradients", options).reconstruct(observation, seed=3)
    sequential = create_attack("inverting-gradients", {**options, "vectorised": False}) \
        .reconstruct(observation, seed=3)
    assert batched.extras["vectorised_restarts"] is True
    assert batched.restart_objectives == pytest.approx(sequential.restart_objectives, rel=1e-4)
    torch.testing.assert_close(batched.images, sequential.images, rtol=0, atol=1e-3)


def test_restart_objective_and_tv_are_the_per_restart_ones():
    gen = torch.Generator().manual_seed(0)
    observed = [torch.randn(4, 3, generator=gen), torch.randn(4, generator=gen)]
    stacked = [torch.randn(5, 4, 3, generator=gen), torch.randn(5, 4, generator=gen)]
    restarts = RestartsCosineObjective(observed)
    torch.testing.assert_close(restarts.value(stacked),
                               restarts.value_and_output_grads([u.clone() for u in stacked])[0])
    values, grads, scales = restarts.value_and_output_grads(stacked)
    single = CosineObjective(observed)
    for r in range(5):
        value, grad, scale = single.value_and_output_grads([u[r].clone() for u in stacked])
        assert values[r].item() == pytest.approx(value.item(), rel=1e-6)
        assert scales[r].item() == pytest.approx(scale.item(), rel=1e-6)
        for many, one in zip(grads, grad, strict=True):
            torch.testing.assert_close(many[r], one)
    images = torch.rand(3, 2, 3, 5, 6, generator=gen)
    tv = restart_total_variation(images)
    for r in range(3):
        assert tv[r].item() == pytest.approx(total_variation(images[r]).item(), rel=1e-6)


def test_a_block_objective_is_each_observations_own_on_its_rows():
    """Rows p·R … p·R + R − 1 are compared by block p alone: value, cotangents and scales."""
    from fedleak.attacks.optimisation.engine.packed import BlockObjective
    from fedleak.attacks.optimisation.gradient_matching import EuclideanObjective

    gen = torch.Generator().manual_seed(1)
    observed = [[torch.randn(4, 3, generator=gen), torch.randn(4, generator=gen)]
                for _ in range(2)]
    blocks = [RestartsCosineObjective(observed[0]), EuclideanObjective(observed[1], rows=True)]
    stacked = [torch.randn(6, 4, 3, generator=gen), torch.randn(6, 4, generator=gen)]
    packed = BlockObjective(blocks, rows=3)
    values, grads, scales = packed.value_and_output_grads([u.clone() for u in stacked])
    torch.testing.assert_close(packed.value(stacked), values)
    for p, block in enumerate(blocks):
        rows = slice(3 * p, 3 * p + 3)
        value, grad, scale = block.value_and_output_grads([u[rows].clone() for u in stacked])
        torch.testing.assert_close(values[rows], value.expand(3))
        torch.testing.assert_close(scales[rows], scale.reshape(-1).expand(3))
        for many, one in zip(grads, grad, strict=True):
            torch.testing.assert_close(many[rows], one)


def observations(protocol: Protocol) -> list:
    """Three rounds of one architecture: other images, other labels, other global models."""
    images = two_images()
    return [make_observation("lenet-zhu", SHAPE, 10, batch, labels, protocol, seed=seed)
            for batch, labels, seed in ((images, torch.tensor([3, 5]), 0),
                                        (images.flip(0), torch.tensor([1, 1]), 1),
                                        (images.roll(3, dims=-1), torch.tensor([7, 2]), 2))]


@PROTOCOLS
def test_packed_attacks_equal_separate_ones(protocol: Protocol):
    """Several rounds attacked as one computation: each gets its separate result."""
    attack = "fedavg" if protocol.kind == "fedavg" else "inverting-gradients"
    options = {"iterations": 20, "restarts": 2, "tv": 1e-3}
    rounds = observations(protocol)
    packed = create_attack(attack, options).reconstruct_many(rounds, seed=4)
    separate = [create_attack(attack, options).reconstruct(o, seed=4 + i)
                for i, o in enumerate(rounds)]
    for one, alone in zip(packed, separate, strict=True):
        assert one.extras["packed_with"] == 3
        assert one.restart_objectives == pytest.approx(alone.restart_objectives, rel=1e-4)
        torch.testing.assert_close(one.images, alone.images, rtol=0, atol=1e-4)
        assert one.labels.tolist() == alone.labels.tolist()
    assert len({round(r.objective, 6) for r in packed}) == 3  # three different problems


def test_unpackable_observations_run_one_after_the_other():
    rounds = observations(Protocol())
    rounds[1] = make_observation("mlp", SHAPE, 10, two_images(), torch.tensor([0, 1]))
    results = create_attack("inverting-gradients", {"iterations": 3}).reconstruct_many(rounds)
    assert [("packed_with" in r.extras) for r in results] == [False, False, False]


def test_packed_targets_take_their_own_seeds():
    """``seeds`` gives each packed target the seed it would be attacked with alone (sweep
    points of one pack share the sweep's seed); a wrong count is refused."""
    rounds = observations(Protocol())[:2]
    attack = create_attack("inverting-gradients", {"iterations": 5})
    packed = attack.reconstruct_many(rounds, seeds=[7, 7])
    for one, observation in zip(packed, rounds, strict=True):
        alone = attack.reconstruct(observation, seed=7)
        torch.testing.assert_close(one.images, alone.images, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="2 targets"):
        attack.reconstruct_many(rounds, seeds=[1])
