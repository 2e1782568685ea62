"""Inverting Gradients: it reconstructs, and each part is the paper's (eq. 4, supplement C)."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks import AttackConfigError, create_attack, describe_options
from fedleak.attacks.base import check_device
from fedleak.attacks.optimisation.presets.inverting_gradients import (
    CosineObjective,
    SignedAdam,
    decay_milestones,
    gaussian_init,
    step_size,
    total_variation,
)
from fedleak.harness.federated.local_update import UpdateSimulator, local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import psnr_per_image
from fedleak.harness.zoo.models import build_model
from tests.helpers import make_observation, to_unit

SHAPE = (3, 8, 8)


def smooth_image(shape: tuple[int, int, int]) -> torch.Tensor:
    """A deterministic smooth colour image on [0.1, 0.9], shape [1, C, H, W]."""
    c, h, w = shape
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    channels = [
        0.5 + 0.4 * torch.sin(3 * xx + 2 * yy + k) * torch.cos(2 * yy - k) for k in range(c)
    ]
    return torch.stack(channels)[None]


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


@pytest.fixture(scope="module")
def observation(image: torch.Tensor):
    return make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([3]))


def test_attack_recovers_a_small_image(observation, image: torch.Tensor):
    attack = create_attack("inverting-gradients", {"iterations": 300, "tv": 1e-4})
    result = attack.reconstruct(observation, seed=0)
    lower, upper = observation.image_bounds()
    start = gaussian_init((1, *SHAPE), 0, torch.device("cpu")).clamp(lower, upper)
    start_psnr = psnr_per_image(to_unit(observation, start), image).item()
    psnr = psnr_per_image(to_unit(observation, result.images), image).item()
    assert psnr > 25.0 and psnr > start_psnr + 15.0, (start_psnr, psnr)
    assert result.labels.tolist() == [3]
    assert result.objective < 1e-2
    assert result.iterations == 300
    assert all(p.grad is None for p in observation.simulate.parameters.values())


def test_fedavg_delta_is_attacked_too(image: torch.Tensor):
    protocol = Protocol(kind="fedavg", local_epochs=2, batch_size=1, learning_rate=1e-2)
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([5]), protocol)
    result = create_attack("inverting-gradients", {"iterations": 200, "tv": 1e-4}).reconstruct(
        observation
    )
    assert psnr_per_image(to_unit(observation, result.images), image).item() > 20.0


def test_box_constraint_holds(observation):
    lower, upper = observation.image_bounds()
    for iterations, lr in ((1, 1e-3), (20, 1.0)):
        options = {"iterations": iterations, "lr": lr}
        boxed = create_attack("inverting-gradients", options).reconstruct(observation, seed=1)
        assert torch.all(boxed.images >= lower) and torch.all(boxed.images <= upper)
    free = create_attack(
        "inverting-gradients", {"iterations": 1, "lr": 1e-3, "boxed": False}
    ).reconstruct(observation, seed=1)
    assert free.images.abs().max() > 1.5  # the N(0, 1) init leaves the box unless projected


def test_restarts_keep_the_lowest_objective(observation):
    attack = create_attack("inverting-gradients", {"iterations": 15, "restarts": 3})
    result = attack.reconstruct(observation, seed=7)
    assert len(result.restart_objectives) == 3
    best = min(range(3), key=result.restart_objectives.__getitem__)
    assert result.objective == result.restart_objectives[best]
    single = create_attack("inverting-gradients", {"iterations": 15}).reconstruct(
        observation, seed=7 + best
    )
    torch.testing.assert_close(result.images, single.images)
    assert single.objective == pytest.approx(result.objective)


def test_progress_counts_across_restarts(observation):
    calls: list[tuple[int, int, float]] = []
    attack = create_attack(
        "inverting-gradients", {"iterations": 10, "restarts": 2, "log_every": 5,
                                "vectorised": False}
    )
    attack.reconstruct(observation, progress=lambda i, t, o: calls.append((i, t, o)))
    assert [c[0] for c in calls] == [1, 5, 10, 11, 15, 20]
    assert {c[1] for c in calls} == {20}
    calls.clear()
    vectorised = create_attack(
        "inverting-gradients", {"iterations": 10, "restarts": 2, "log_every": 5}
    )
    vectorised.reconstruct(observation, progress=lambda i, t, o: calls.append((i, t, o)))
    assert [c[0] for c in calls] == [2, 10, 20]  # R restart-iterations per batched step
    assert {c[1] for c in calls} == {20}


def test_step_size_decays_at_three_five_seven_eighths():
    assert decay_milestones(4800) == (1800, 3000, 4200)
    lrs = [step_size(i, 4800, 0.1) for i in (0, 1799, 1800, 2999, 3000, 4199, 4200, 4799)]
    assert lrs == pytest.approx([0.1, 0.1, 0.01, 0.01, 1e-3, 1e-3, 1e-4, 1e-4])
    assert step_size(4799, 4800, 0.1, decay=False) == 0.1


def test_step_size_matches_multisteplr():
    iterations = 40
    x = torch.zeros(1, requires_grad=True)
    optimiser = torch.optim.SGD([x], lr=0.1)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimiser, list(decay_milestones(iterations)), gamma=0.1
    )
    for i in range(iterations):
        assert step_size(i, iterations, 0.1) == pytest.approx(optimiser.param_groups[0]["lr"])
        optimiser.step()
        scheduler.step()


def test_signed_adam_is_torch_adam_on_the_sign():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 4, 4, generator=gen)
    ours = torch.randn(2, 3, 4, 4, generator=gen)
    theirs = ours.clone().requires_grad_(True)
    optimiser = SignedAdam(ours)
    reference = torch.optim.Adam([theirs], lr=0.05)
    for i in range(30):
        optimiser.step((ours - target) ** 3, lr=0.05)
        reference.zero_grad()
        ((theirs - target) ** 4 / 4).sum().backward()
        theirs.grad.sign_()
        reference.step()
        torch.testing.assert_close(ours, theirs.detach(), rtol=1e-5, atol=1e-6, msg=f"step {i}")


def test_objective_gradient_is_autograd_of_eq4(observation):
    """The analytic outer gradient equals autograd through 1 − cos(cat(u), cat(u*)) + α TV."""
    labels = torch.tensor([3])
    x = torch.randn(1, *SHAPE, generator=torch.Generator().manual_seed(3), requires_grad=True)
    observed = torch.cat([u.flatten() for u in observation.update])
    replay = torch.cat([u.flatten() for u in observation.simulate(x, labels)])
    reference = 1 - torch.nn.functional.cosine_similarity(replay, observed, dim=0)
    reference = reference + 0.01 * total_variation(x)
    (expected,) = torch.autograd.grad(reference, x)

    objective = CosineObjective(observation.update)
    update = observation.simulate(x, labels)
    value, output_grads, scale = objective.value_and_output_grads(update)
    tv = total_variation(x)
    (grad,) = torch.autograd.grad([*update, tv], x, [*output_grads, 0.01 / scale])
    grad = grad * scale
    assert (value + 0.01 * tv).item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-7)


def _graph_nodes(outputs: list[torch.Tensor]) -> set[str]:
    seen, names = set(), set()
    stack = [u.grad_fn for u in outputs if u.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return names


@pytest.mark.parametrize(
    "protocol",
    [Protocol(), Protocol(kind="fedavg", local_epochs=1, batch_size=1, learning_rate=0.1)],
    ids=["fedsgd", "fedavg"],
)
def test_replay_second_derivatives_match_pytorch(protocol: Protocol):
    """The simulator's lean conv/BN second derivatives equal PyTorch's own (``local_update``)."""
    torch.manual_seed(0)
    model = build_model("resnet20-4", (3, 16, 16), 10)
    simulator = UpdateSimulator(
        model, dict(model.named_parameters()), dict(model.named_buffers()), protocol
    )
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    labels = torch.tensor([1, 7])
    native = local_update(
        model, simulator.parameters, simulator.buffers, x, labels, protocol, create_graph=True
    )
    lean = simulator(x, labels)
    assert {"_Conv2dBackwardBackward", "_BatchNormBackwardBackward"} <= _graph_nodes(lean)
    for a, b in zip(native, lean, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    cotangents = [torch.randn_like(u) for u in native]
    (expected,) = torch.autograd.grad(native, x, cotangents)
    (got,) = torch.autograd.grad(lean, x, cotangents)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())
    with pytest.raises(RuntimeError, match="third derivatives"):
        (second,) = torch.autograd.grad(simulator(x, labels), x, cotangents, create_graph=True)
        torch.autograd.grad(second.sum(), x)


def test_total_variation_is_mean_absolute_difference():
    x = torch.zeros(1, 1, 2, 3)
    x[..., 0, 1] = 1.0  # one bright pixel
    # horizontal: |0-1| + |1-0| over 4 pairs; vertical: |1-0| over 3 pairs
    assert total_variation(x).item() == pytest.approx(2 / 4 + 1 / 3)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(AttackConfigError) as err:
        create_attack("inverting-gradients", {"iteratons": 10})
    for name in ("iterations", "restarts", "lr", "tv"):
        assert name in str(err.value)
    assert "iterations" in describe_options("inverting-gradients")


def test_string_options_are_converted():
    attack = create_attack(
        "inverting-gradients", {"iterations": "12", "tv": "1e-3", "signed": "false"}
    )
    assert attack.config.iterations == 12
    assert attack.config.tv == 1e-3
    assert attack.config.signed is False


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="iterations"):
        create_attack("inverting-gradients", {"iterations": 0})
    with pytest.raises(ValueError, match="lr"):
        create_attack("inverting-gradients", {"lr": -1.0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_without_cuda_is_refused(observation):
    with pytest.raises(ValueError, match="CUDA"):
        check_device(observation, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_runs_on_cuda(image: torch.Tensor):
    observation = make_observation(
        "lenet-zhu", SHAPE, 10, image, torch.tensor([3]), device="cuda"
    )
    result = create_attack("inverting-gradients", {"iterations": 300, "tv": 1e-4}).reconstruct(
        observation, device="cuda"
    )
    assert result.images.device.type == "cuda"
    assert psnr_per_image(to_unit(observation, result.images).cpu(), image).item() > 25.0
    with pytest.raises(ValueError, match="lives on"):
        check_device(make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([3])), "cuda")


def test_reconstruct_is_the_shared_template() -> None:
    """Every attack runs inside Attack.reconstruct: target type, device, forked seeding."""
    from fedleak.attacks.release import ReleasedModel

    image = smooth_image(SHAPE)
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([3]))
    attack = create_attack("inverting-gradients", {"iterations": 3})
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = attack.reconstruct(observation, seed=5)
    assert torch.equal(torch.rand(1), before)  # the caller's RNG stream is left as it was
    second = attack.reconstruct(observation, seed=5)
    assert torch.equal(first.images, second.images)
    released = ReleasedModel.from_module(torch.nn.Linear(4, 1, bias=False), (4,), num_train=2)
    with pytest.raises(TypeError, match="type Observation, got ReleasedModel"):
        attack.reconstruct(released)


def _optimised(device: str, graph_safe: bool, iterations: int = 40) -> torch.Tensor:
    """The one-restart loop from a fixed init, eager or with the graph-safe step."""
    from fedleak.attacks.labels import recover_labels
    from fedleak.attacks.optimisation.engine.problem import ProgressSpan
    from fedleak.attacks.optimisation.presets.inverting_gradients import (
        InvertingGradients,
        InvertingGradientsConfig,
    )

    image = smooth_image(SHAPE)
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([3]),
                                   device=device)
    attack = InvertingGradients(InvertingGradientsConfig(iterations=iterations))
    labels = recover_labels(observation)
    objective = CosineObjective(observation.update)
    images = gaussian_init((1, *SHAPE), 0, torch.device(device)).unsqueeze(0)

    def one_by_one(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [u.unsqueeze(0) for u in observation.simulate(x[0], y)]

    problem = attack.problem(labels, one_by_one, objective, attack.bind_priors(observation),
                             observation.image_bounds(device), rows=False)
    _, result = attack.optimise(problem, images, ProgressSpan(None, 0, iterations),
                                graph_safe=graph_safe)
    return result.detach().cpu()


def test_the_graph_safe_step_matches_the_eager_loop() -> None:
    """The step a CUDA graph captures (device-side schedule and Adam state) is the eager
    step's maths: the same iterate after 40 steps, to float tolerance, on the CPU."""
    eager, graph_safe = _optimised("cpu", False), _optimised("cpu", True)
    torch.testing.assert_close(graph_safe, eager, rtol=0, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_iterations_match_eager_on_cuda() -> None:
    captured, eager = _optimised("cuda", True), _optimised("cuda", False)
    torch.testing.assert_close(captured, eager, rtol=0, atol=1e-4)
