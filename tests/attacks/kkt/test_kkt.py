"""The KKT attack of Haim et al. (2022), its post-processing, scoring and the victim's training."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedleak.attacks import AttackConfigError, attack_class, create_attack
from fedleak.attacks.kkt.loss import (
    SmoothBackwardReLU,
    candidate_labels,
    stationarity_loss,
    with_smooth_relu,
)
from fedleak.attacks.kkt.postprocess import (
    normalized_cross_correlation,
    postprocess_candidates,
    remove_duplicates,
    scale_to_unit,
)
from fedleak.attacks.release import ReleasedModel
from fedleak.harness.federated.release_training import (
    ReleaseTrainingConfig,
    build_release_model,
    release,
    to_model_input,
    train_release,
)
from fedleak.harness.metrics.kkt_metrics import match_to_training
from fedleak.harness.zoo.binary_tasks import balanced_subset, binary_task
from fedleak.harness.zoo.models import build_model

# --- stationarity (eq. (6)) is zero at a KKT point built by hand ---------------------------


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}


def _stationarity(model: nn.Module, x: torch.Tensor, lambdas: torch.Tensor,
                  y: torch.Tensor, at: nn.Module | None = None) -> float:
    """L_stationary of ``model`` evaluated at the parameters of ``at`` (default: ``model``)."""
    return float(stationarity_loss(model, _parameters(at or model), x, lambdas, y).detach())


def test_stationarity_is_zero_for_a_linear_model() -> None:
    """Φ(w; x) = ⟨w, x⟩ has ∇_w Φ = x, so w := Σ λ_i y_i x_i is a KKT point by construction."""
    torch.manual_seed(0)
    n, d = 5, 7
    x = torch.randn(n, d, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    lambdas = torch.rand(n, dtype=torch.float64)
    model = nn.Linear(d, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_((lambdas * y) @ x)
    # m = 2n candidates: the n points plus n arbitrary ones with λ = 0 (Sec. 3.2).
    extra = torch.randn(n, d, dtype=torch.float64)
    xs, ys = torch.cat([x, extra]), torch.cat([y, -y])
    ls = torch.cat([lambdas, torch.zeros(n, dtype=torch.float64)])
    assert _stationarity(model, xs, ls, ys) <= 1e-10
    assert _stationarity(model, xs, ls * 1.1, ys) > 1e-3


def _two_layer_kkt_point(
    n: int = 4, d: int = 6, units: int = 3, eps: float = 0.1
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A bias-free Φ = Σ_j v_j relu(w_j·x) exactly at a KKT point of problem (1).

    x_i = e_i − ε Σ_{k≠i, k<n} e_k are pairwise obtuse. Unit j of point i has w_j = a_j x_i/‖x_i‖
    (active on x_i only, since x_i·x_k < 0) and v_j = y_i a_j. Eq. (2) for w_j reads
    a_j x_i/‖x_i‖ = λ_i y_i v_j x_i, for v_j: v_j = λ_i y_i a_j ‖x_i‖; both hold with
    λ_i = 1/‖x_i‖ for every a_j > 0.
    """
    x = torch.eye(d, dtype=torch.float64)[:n]
    x[:, :n] -= eps * (1 - torch.eye(n, dtype=torch.float64))
    y = torch.tensor([1.0, -1.0] * (n // 2), dtype=torch.float64)
    norms = x.norm(dim=1)
    weights, outputs = [], []
    for i in range(n):
        for j in range(units):
            a = 0.5 + j
            weights.append(a * x[i] / norms[i])
            outputs.append(y[i] * a)
    model = nn.Sequential(nn.Linear(d, n * units, bias=False), nn.ReLU(),
                          nn.Linear(n * units, 1, bias=False)).double()
    with torch.no_grad():
        model[0].weight.copy_(torch.stack(weights))
        model[2].weight.copy_(torch.stack(outputs)[None])
    return model, x, y, 1 / norms


def test_stationarity_is_zero_at_a_two_layer_relu_kkt_point() -> None:
    model, x, y, lambdas = _two_layer_kkt_point()
    assert _stationarity(model, x, lambdas, y) <= 1e-10
    # The attack's smooth-backward copy agrees where no pre-activation is near 0.
    smooth, swapped = with_smooth_relu(model, alpha=1e4)
    assert swapped == 1
    assert _stationarity(smooth, x, lambdas, y, at=model) <= 1e-10
    assert _stationarity(model, x * 1.05, lambdas, y) > 1e-3


# --- the modified ReLU ---------------------------------------------------------------------


def test_smooth_relu_is_relu_forward_and_sigmoid_backward() -> None:
    z = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    alpha = 7.0
    out = SmoothBackwardReLU.apply(z, alpha)
    assert torch.equal(out, torch.relu(z))
    upstream = torch.randn(41, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out, z, upstream, create_graph=True)
    assert torch.allclose(grad, upstream * torch.sigmoid(alpha * z))
    # Twice differentiable: d/dz [g σ(αz)] = g α σ(αz)(1 − σ(αz)).
    (second,) = torch.autograd.grad(grad.sum(), z)
    s = torch.sigmoid(alpha * z)
    assert torch.allclose(second, upstream * alpha * s * (1 - s))


def test_swapping_relus_leaves_the_callers_model_alone() -> None:
    model = build_model("kkt-mlp:width=8,depth=2", (1, 4, 4), 2)
    before = [p.detach().clone() for p in model.parameters()]
    twin, swapped = with_smooth_relu(model, 50.0)
    assert swapped == 2
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2
    assert not any(isinstance(m, nn.ReLU) for m in twin.modules())
    released = ReleasedModel.from_module(model, (1, 4, 4), num_train=3)
    create_attack("kkt", {"iterations": 3, "lr_low": 1e-3, "lr_high": 1e-3}).reconstruct(released)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(isinstance(m, nn.ReLU) for m in model.modules() if "ReLU" in type(m).__name__)


# --- the attack through the registry ---------------------------------------------------------


def _small_release(n: int = 4) -> ReleasedModel:
    model = build_release_model((1, 4, 4), width=16, depth=2, init_std=1e-2, seed=1)
    return release(model, (1, 4, 4), n)


def test_kkt_attack_shapes_labels_extras_and_determinism() -> None:
    released = _small_release()
    options = {"iterations": 20, "runs": 2, "log_every": 5, "lr_low": 1e-4, "lr_high": 1e-2}
    calls: list[tuple[int, int, float]] = []
    result = create_attack("kkt", options).reconstruct(
        released, seed=3, progress=lambda i, t, v: calls.append((i, t, v))
    )
    assert result.images.shape == (2 * 8, 1, 4, 4)
    assert result.labels.tolist() == ([1] * 4 + [-1] * 4) * 2
    extras = result.extras
    assert extras["lambdas"].shape == (16,) and extras["run_index"].tolist() == [0] * 8 + [1] * 8
    assert len(extras["run_settings"]) == len(extras["run_objectives"]) == 2
    assert all(1e-4 <= s["lr"] <= 1e-2 and 10 <= s["alpha"] <= 500 for s in extras["run_settings"])
    assert calls and calls[-1][0] == 40 and all(t == 40 for _, t, _ in calls)
    again = create_attack("kkt", options).reconstruct(released, seed=3)
    assert torch.equal(again.images, result.images)
    # A search split into chunks gives the same runs.
    second = create_attack("kkt", {**options, "runs": 1, "first_run": 1}).reconstruct(
        released, seed=3
    )
    assert torch.equal(second.images, result.images[8:])
    assert attack_class("kkt").threat_model == "release"
    assert attack_class("dlg").threat_model == "update"


def test_kkt_attack_lowers_the_objective() -> None:
    model, _, _, _ = _two_layer_kkt_point()  # a model at an exact KKT point: zero is reachable
    released = ReleasedModel.from_module(model, (6,), num_train=4)
    options = {"lr_low": 1e-3, "lr_high": 1e-3, "sigma_x_low": 0.1, "sigma_x_high": 0.1,
               "float64": True, "alpha3": 0.0}
    start = create_attack("kkt", {**options, "iterations": 1}).reconstruct(released)
    end = create_attack("kkt", {**options, "iterations": 300}).reconstruct(released)
    assert end.objective < 0.05 * start.objective
    assert end.images.dtype == torch.float64 and not end.extras["run_diverged"][0]


def test_unknown_kkt_option_lists_the_valid_ones() -> None:
    with pytest.raises(AttackConfigError, match="iterations.*lambda-min-low"):
        create_attack("kkt", {"step_size": "1"})
    with pytest.raises(ValueError, match="lr range"):
        create_attack("kkt", {"lr_low": "1", "lr_high": "0.1"})
    with pytest.raises(ValueError, match="num-candidates"):
        model = build_release_model((2,), width=4, depth=1)
        create_attack("kkt").reconstruct(release(model, (2,), None))


def test_candidate_labels_are_half_and_half() -> None:
    assert candidate_labels(6).tolist() == [1, 1, 1, -1, -1, -1]


# --- post-processing and scoring ------------------------------------------------------------


def test_postprocessing_scales_filters_and_merges_duplicates() -> None:
    torch.manual_seed(0)
    a, b = torch.rand(1, 1, 6, 6), torch.rand(1, 1, 6, 6)
    candidates = torch.cat([a * 3 - 1, a * 2 + 0.01 * torch.randn(1, 1, 6, 6), b, a, b * 5])
    lambdas = torch.tensor([0.9, 0.5, 0.8, 0.01, 0.3])
    scaled = scale_to_unit(candidates)
    assert torch.allclose(scaled.flatten(1).min(1).values, torch.zeros(5))
    assert torch.allclose(scaled.flatten(1).max(1).values, torch.ones(5))
    processed = postprocess_candidates(candidates, lambdas, lambda_threshold=0.1, merge_ncc=0.95)
    assert len(processed) == 2
    assert processed.group.tolist() == [0, 0, 1, -1, 1]
    assert torch.allclose(processed.lambdas, torch.tensor([0.9, 0.8]))
    assert float(normalized_cross_correlation(processed.images[:1], a)) > 0.99
    assert len(postprocess_candidates(candidates, lambdas, merge_ncc=2.0)) == 5


def test_remove_duplicates_keeps_one_point_per_cluster() -> None:
    points = torch.tensor([[0.0, 0.0], [0.01, 0.0], [1.0, 0.0], [1.0, 0.02], [0.0, 1.0]])
    kept = remove_duplicates(points, torch.tensor([1.0, 2.0, 0.5, 0.6, 0.1]), 0.03)
    assert kept.tolist() == [1, 3, 4]


def test_match_to_training_finds_each_samples_best_candidate() -> None:
    torch.manual_seed(0)
    train = torch.rand(3, 1, 8, 8)
    candidates = torch.cat([torch.rand(5, 1, 8, 8), train[2:3], train[0:1]])
    match = match_to_training(candidates, train)
    assert match.index[0] == 6 and match.index[2] == 5
    assert match.ssim[0] > 0.999 and match.ssim[2] > 0.999 and match.ssim[1] < 0.999
    assert match.recovered(0.999) == 2
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        match_to_training(candidates * 3, train)


# --- the victim's training and its binary tasks ---------------------------------------------


def test_release_training_reaches_the_target_and_is_deterministic() -> None:
    torch.manual_seed(0)
    images = torch.rand(6, 1, 4, 4)
    labels = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    config = ReleaseTrainingConfig(lr=0.5, max_epochs=20_000, target_loss=1e-3, report_every=50)
    runs = []
    for _ in range(2):
        model = build_release_model((1, 4, 4), width=32, depth=2, seed=7)
        seen: list[tuple[int, float, float]] = []
        result = train_release(model, to_model_input(images), labels, config,
                               on_epoch=lambda e, loss, acc, seen=seen: seen.append((e, loss, acc)))
        runs.append((result, [p.detach().clone() for p in model.parameters()], seen))
    (first, params_a, seen), (second, params_b, _) = runs
    assert first.reached_target and first.loss <= 1e-3 and first.train_accuracy == 1.0
    assert first.epochs == second.epochs and first.epochs < 20_000
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b, strict=True))
    assert seen[0][0] == 1 and seen[-1] == (first.epochs, first.loss, first.train_accuracy)
    released = release(first.model, (1, 4, 4), 6)
    assert released.value_range == (-1.0, 1.0) and released.num_train == 6


def test_dp_release_training_reports_epsilon() -> None:
    torch.manual_seed(0)
    images, labels = torch.rand(6, 1, 4, 4), torch.tensor([1.0, -1.0] * 3)
    model = build_release_model((1, 4, 4), width=16, depth=2, seed=0)
    config = ReleaseTrainingConfig(lr=0.5, max_epochs=30, target_loss=0.0,
                                   dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_delta=1e-5)
    result = train_release(model, to_model_input(images), labels, config, seed=1)
    assert result.epochs == 30 and result.epsilon is not None and 0 < result.epsilon < math.inf
    assert all(isinstance(m, (nn.Linear, nn.ReLU, nn.Flatten, nn.Sequential))
               for m in model.modules() if m is not model)
    assert not any(getattr(p, "grad_sample", None) is not None for p in model.parameters())


def test_kkt_mlp_is_the_papers_homogeneous_network() -> None:
    model = build_model("kkt-mlp:width=8,depth=2,init-std=0.01", (1, 8, 8), 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [m.bias is not None for m in linears] == [True, False, False]
    assert linears[-1].out_features == 1
    x = torch.randn(5, 1, 8, 8)
    scaled = build_model("kkt-mlp:width=8,depth=2,init-std=0.01", (1, 8, 8), 10)
    with torch.no_grad():
        for p, q in zip(scaled.parameters(), model.parameters(), strict=True):
            p.copy_(2 * q)
        assert torch.allclose(scaled(x), 8 * model(x), rtol=1e-4, atol=1e-6)  # degree 3


def test_binary_tasks_map_classes_to_plus_minus_one() -> None:
    assert binary_task("digits")(torch.arange(10)).tolist() == [-1, 1] * 5
    # CIFAR-10: airplane, automobile, ship, truck are vehicles (+1).
    assert binary_task("cifar10")(torch.arange(10)).tolist() == [1, 1, -1, -1, -1, -1, -1, -1,
                                                                  1, 1]
    assert binary_task("faces")(torch.tensor([0, 1])).tolist() == [1, -1]
    assert binary_task("photos")(torch.arange(10)).tolist() == [1] * 5 + [-1] * 5
    with pytest.raises(ValueError, match="digits"):
        binary_task("cifar100")
    indices, y = balanced_subset(torch.arange(100) % 10, "digits", 7, seed=0)
    assert y.tolist() == [1] * 4 + [-1] * 3 and len(set(indices.tolist())) == 7


@pytest.mark.parametrize("options", [
    {"optimizer": "sgd", "lr_low": 1e-3, "lr_high": 1e-2, "lambda_lr": 1e-3},
    {"optimizer": "adam", "lr_low": 1e-3, "lr_high": 1e-2},
    {"optimizer": "sgd", "lr_low": 1e6, "lr_high": 1e6},  # diverges: the last checked state
])
def test_the_graph_safe_step_matches_the_eager_loop(monkeypatch: pytest.MonkeyPatch,
                                                    options: dict) -> None:
    """The step a CUDA graph captures (device-side optimiser state, finiteness test and
    snapshot every log_every steps) gives the eager loop's runs on the CPU."""
    import fedleak.attacks.kkt.reconstruction as kkt

    released = _small_release()
    options = {**options, "iterations": 23, "runs": 2, "log_every": 5}
    calls: dict[bool, list[tuple[int, int, float]]] = {False: [], True: []}
    results = {}
    for graph_safe in (False, True):
        monkeypatch.setattr(kkt, "capturable", lambda _device, on=graph_safe: on)
        results[graph_safe] = create_attack("kkt", options).reconstruct(
            released, seed=4, progress=lambda *call, g=graph_safe: calls[g].append(call))
    eager, graph_safe = results[False], results[True]
    assert graph_safe.extras["captured"] and not eager.extras["captured"]
    assert graph_safe.extras["run_diverged"] == eager.extras["run_diverged"]
    torch.testing.assert_close(graph_safe.images, eager.images, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(graph_safe.extras["lambdas"], eager.extras["lambdas"],
                               rtol=1e-5, atol=1e-5)
    assert graph_safe.extras["run_objectives"] == pytest.approx(
        eager.extras["run_objectives"], rel=1e-4)
    assert [c[:2] for c in calls[True]] == [c[:2] for c in calls[False]]
    if options["lr_low"] == 1e6:
        assert all(eager.extras["run_diverged"])


@pytest.mark.parametrize(("seed", "options"), [
    (4, {"optimizer": "sgd", "lr_low": 1e-3, "lr_high": 1e-1, "float64": True}),
    (4, {"optimizer": "adam", "lr_low": 1e-3, "lr_high": 1e-1, "float64": True,
         "lambda_lr": 1e-2}),
    (2, {"optimizer": "sgd", "lr_low": 1e-3, "lr_high": 1e7}),  # two runs diverge, two not
])
def test_packed_runs_land_where_runs_alone_land(seed: int, options: dict) -> None:
    """K runs of the random search as one vmapped computation (per-run θ-gradients, ReLU
    sharpness, learning rates and divergence) give each run the result it gets alone."""
    released = _small_release()
    options = {**options, "iterations": 23, "runs": 4, "log_every": 5}
    alone = create_attack("kkt", options).reconstruct(released, seed=seed)
    calls: list[tuple[int, int, float]] = []
    packed = create_attack("kkt", {**options, "pack": 3}).reconstruct(
        released, seed=seed, progress=lambda *call: calls.append(call))
    assert packed.extras["run_diverged"] == alone.extras["run_diverged"]
    if options["lr_high"] == 1e7:
        assert packed.extras["run_diverged"] == [True, True, False, False]
    torch.testing.assert_close(packed.images, alone.images, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed.extras["lambdas"], alone.extras["lambdas"],
                               rtol=1e-5, atol=1e-6)
    assert packed.extras["run_objectives"] == pytest.approx(alone.extras["run_objectives"],
                                                            rel=1e-6)
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == 92 and all(c[1] == 92 for c in calls)


def test_detached_smooth_relu_has_the_functions_derivatives() -> None:
    """relu(z)⁺ + s − s̄ with s = log(1 + e^{αz})/α: value relu, first and second derivatives
    those of SmoothBackwardReLU (σ(αz) and ασ(αz)(1 − σ(αz)))."""
    from fedleak.attacks.kkt.loss import SmoothBackwardReLU
    from fedleak.attacks.kkt.packed_search import DetachedSmoothReLU, Sharpness

    sharpness = Sharpness()
    sharpness.alpha = torch.tensor(7.0, dtype=torch.float64)
    z = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    outputs = {"function": SmoothBackwardReLU.apply(z, 7.0),
               "detached": DetachedSmoothReLU(sharpness)(z)}
    derivatives = {}
    for name, out in outputs.items():
        assert torch.equal(out.detach(), z.detach().clamp_min(0))
        (first,) = torch.autograd.grad(out.sum(), z, create_graph=True)
        (second,) = torch.autograd.grad(first.sum(), z)
        derivatives[name] = (first.detach(), second)
    for got, want in zip(derivatives["detached"], derivatives["function"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
