"""The victim's training of the model it releases: Haim et al.'s binary classifier (Sec. 5.1).

The user trains ``kkt-mlp`` (d–1000–1000–1 ReLU MLP, bias only in the first layer, first layer
initialised ~ N(0, 1e-4²), see :class:`fedleak.harness.models.KKTMLP`) on n private samples
with labels y ∈ {±1}, by full-batch gradient descent on the mean logistic loss

    L(θ) = (1/n) Σ_i ℓ(y_i Φ(θ; x_i)),   ℓ(q) = log(1 + e^{−q})   (Sec. 3.1),

(the paper writes the sum; the mean is the same descent with the step size divided by n, and
the "training loss" it reports is the mean). Training stops when L ≤ ``target_loss`` (measured
before the step, so the released θ has that loss) or after ``max_epochs`` epochs; the paper
trains 10⁶ epochs at lr 0.01 to L < 10⁻⁶ and shows 10⁴ epochs suffice (App. C.3).

Input scaling: images on [0, 1] are mapped to [−1, 1] by x ↦ 2x − 1 (:func:`to_model_input`)
before training, the box the paper's L_prior assumes; the release says so in ``value_range``.

Optional differential privacy (Abadi et al. 2016) through Opacus: every epoch clips each
sample's gradient to norm ``dp_max_grad_norm`` and adds N(0, (σ·C)²) noise to their sum
(``dp_noise_multiplier`` σ), still one full batch per epoch (sampling rate 1, no Poisson
sampling). The RDP accountant reports ε at ``dp_delta`` for the epochs run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedleak.attacks.release import ReleasedModel
from fedleak.harness.zoo.models import ModelSpec, build_model

#: The box inputs are scaled to (paper Sec. 5.2).
VALUE_RANGE = (-1.0, 1.0)

#: ``on_epoch(epoch, loss, train_accuracy)``; ``epoch`` counts from 1.
EpochCallback = Callable[[int, float, float], None]


def to_model_input(images01: Tensor) -> Tensor:
    """Images on [0, 1] → the model's input space [−1, 1]: x ↦ 2x − 1."""
    return images01 * 2 - 1


def from_model_input(inputs: Tensor) -> Tensor:
    """Inverse of :func:`to_model_input`: [−1, 1] → [0, 1] (not clamped)."""
    return (inputs + 1) / 2


def build_release_model(
    shape: tuple[int, ...],
    *,
    width: int = 1000,
    depth: int = 2,
    init_std: float = 1e-4,
    seed: int = 0,
) -> nn.Module:
    """``kkt-mlp`` for inputs of ``shape``, initialised from ``seed`` (global RNG untouched)."""
    spec = ModelSpec("kkt-mlp", {"width": str(width), "depth": str(depth),
                                 "init-std": repr(float(init_std))})
    if len(shape) not in (1, 3):
        raise ValueError(f"input shape must be (d,) or (C, H, W), got {tuple(shape)}")
    chw = (1, 1, shape[0]) if len(shape) == 1 else (shape[0], shape[1], shape[2])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(spec, chw, 2)


def logistic_loss(outputs: Tensor, labels: Tensor) -> Tensor:
    """Mean of ℓ(y Φ) = log(1 + e^{−y Φ}) = softplus(−y Φ), for y ∈ {±1}."""
    return F.softplus(-labels * outputs.reshape(-1)).mean()


@dataclass
class ReleaseTrainingConfig:
    """Full-batch gradient descent until a target loss, optionally with DP-SGD."""

    lr: float = field(default=0.01, metadata={"help": "gradient-descent step size (paper 0.01)"})
    max_epochs: int = field(default=100_000, metadata={"help": "epochs at most (paper 1e6)"})
    target_loss: float = field(
        default=1e-6, metadata={"help": "stop once the mean training loss is at most this"}
    )
    report_every: int = field(
        default=100, metadata={"help": "call on_epoch every k epochs (and at the last)"}
    )
    dp_noise_multiplier: float = field(
        default=0.0, metadata={"help": "DP-SGD noise multiplier sigma; 0 = no DP"}
    )
    dp_max_grad_norm: float = field(
        default=1.0, metadata={"help": "DP-SGD per-sample clipping norm C"}
    )
    dp_delta: float = field(default=1e-5, metadata={"help": "delta at which epsilon is reported"})

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.max_epochs < 1 or self.report_every < 1:
            raise ValueError("max_epochs and report_every must be >= 1")
        if not self.target_loss >= 0:
            raise ValueError(f"target_loss must be >= 0, got {self.target_loss}")
        if not self.dp_noise_multiplier >= 0:
            raise ValueError(f"dp_noise_multiplier must be >= 0, got {self.dp_noise_multiplier}")
        if self.dp and not self.dp_max_grad_norm > 0:
            raise ValueError(f"dp_max_grad_norm must be positive, got {self.dp_max_grad_norm}")
        if self.dp and not 0 < self.dp_delta < 1:
            raise ValueError(f"dp_delta must be in (0, 1), got {self.dp_delta}")

    @property
    def dp(self) -> bool:
        """Whether training is differentially private."""
        return self.dp_noise_multiplier > 0


@dataclass
class ReleaseTrainingResult:
    """How training ended: epochs run, final loss and accuracy, ε if DP, reported history."""

    model: nn.Module
    epochs: int
    loss: float
    train_accuracy: float
    reached_target: bool
    epsilon: float | None = None
    delta: float | None = None
    history: list[tuple[int, float, float]] = field(default_factory=list)


def _check_training_set(inputs: Tensor, labels: Tensor) -> None:
    if inputs.shape[0] != labels.shape[0] or labels.dim() != 1:
        raise ValueError(f"{inputs.shape[0]} inputs but labels of shape {tuple(labels.shape)}")
    if not bool(((labels == 1) | (labels == -1)).all()):
        raise ValueError("labels must be +1 or -1 (see fedleak.harness.zoo.binary_tasks)")
    if not bool(torch.isfinite(inputs).all()):
        raise ValueError("inputs must be finite")


def train_release(
    model: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    config: ReleaseTrainingConfig | None = None,
    *,
    seed: int = 0,
    on_epoch: EpochCallback | None = None,
) -> ReleaseTrainingResult:
    """Train ``model`` in place on ``inputs`` (model space, e.g. :func:`to_model_input` of
    images) and ``labels`` y ∈ {±1}; full batch, deterministic given the model's init and
    ``seed`` (which only seeds the DP noise). Inputs, labels and model must share a device.
    """
    config = config or ReleaseTrainingConfig()
    _check_training_set(inputs, labels)
    labels = labels.to(inputs.dtype)
    if config.dp:
        return _train_dp(model, inputs, labels, config, seed, on_epoch)
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr)
    return _descend(model, model, optimiser, inputs, labels, config, on_epoch)


def _descend(
    model: nn.Module,
    trained: nn.Module,
    optimiser: torch.optim.Optimizer,
    inputs: Tensor,
    labels: Tensor,
    config: ReleaseTrainingConfig,
    on_epoch: EpochCallback | None,
) -> ReleaseTrainingResult:
    """The gradient-descent loop; ``trained`` is ``model`` or its DP wrapper."""
    history: list[tuple[int, float, float]] = []
    loss_value, accuracy, reached = math.inf, 0.0, False
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        outputs = trained(inputs).reshape(-1)
        loss = logistic_loss(outputs, labels)
        loss_value = float(loss.detach())
        accuracy = float((torch.sign(outputs.detach()) == labels).float().mean())
        reached = loss_value <= config.target_loss
        last = reached or epoch == config.max_epochs or not math.isfinite(loss_value)
        if epoch % config.report_every == 0 or epoch == 1 or last:
            history.append((epoch, loss_value, accuracy))
            if on_epoch is not None:
                on_epoch(epoch, loss_value, accuracy)
        if last:
            break
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    return ReleaseTrainingResult(model, epoch, loss_value, accuracy, reached, history=history)


def _train_dp(
    model: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    config: ReleaseTrainingConfig,
    seed: int,
    on_epoch: EpochCallback | None,
) -> ReleaseTrainingResult:
    """DP-SGD through Opacus' PrivacyEngine: one full batch per epoch, RDP accounting."""
    from opacus import PrivacyEngine

    n = inputs.shape[0]
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=n, shuffle=False
    )
    engine = PrivacyEngine(accountant="rdp")
    generator = torch.Generator(device=inputs.device).manual_seed(seed)
    private, optimiser, _ = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=config.lr),
        data_loader=loader,
        noise_multiplier=config.dp_noise_multiplier,
        max_grad_norm=config.dp_max_grad_norm,
        poisson_sampling=False,
        noise_generator=generator,
    )
    try:
        with warnings.catch_warnings():
            # Opacus' per-sample hooks fire although the inputs need no gradient: harmless.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            result = _descend(model, private, optimiser, inputs, labels, config, on_epoch)
    finally:
        private.to_standard_module()
    for parameter in model.parameters():
        parameter.grad = None
        if hasattr(parameter, "grad_sample"):
            parameter.grad_sample = None
    result.epsilon = float(engine.get_epsilon(config.dp_delta))
    result.delta = config.dp_delta
    return result


def release(
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_train: int | None,
    *,
    metadata: dict[str, object] | None = None,
) -> ReleasedModel:
    """What the user publishes: architecture, trained θ, input shape, [−1, 1] scaling, n."""
    return ReleasedModel.from_module(
        model, input_shape, num_train=num_train, value_range=VALUE_RANGE, metadata=metadata
    )
