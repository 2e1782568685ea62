"""Qian & Hansen (2021), "What can we learn from gradients?", Algorithm 2: DLG with a uniform
initialisation and a decaying regulariser.

The attack minimises the euclidean gradient distance of DLG plus a regulariser R,

    x̂ = argmin_x  Σ_l ‖u_l(x, ŷ) − u*_l‖²  +  λ_i R(x),

* one image: the L2 regulariser ``R(x) = ‖x‖_F²`` (Sec. 4: it keeps x̂ small early on, away
  from sigmoid saturation and near the valid range);
* a batch of n: the orthogonality regulariser ``R(x) = Σ_{k≠k'} (x_kᵀ x_{k'})²`` (x_k the k-th
  image flattened), which pushes the reconstructions apart so they do not all converge to the
  same mixture (Sec. 4, Fig. 5);

with ``λ_i = λ₀ · 0.9^⌊i/m⌋`` (Algorithm 2, lines 15–16: λ ← 0.9 λ every m iterations), so the
bias of the regulariser fades out. The paper's model takes images on [0, 1] directly; here the
model sees normalised images, so the attack optimises those but evaluates R on the same images
mapped back to [0, 1] (``x·std + mean``), the space the paper's regularisers were designed for
(there a dark background is 0, and two digits are orthogonal when their strokes do not
overlap; in the normalised space the shared background alone makes every pair correlated).
The initial images are drawn from U(0, 1) in that pixel space (Algorithm 2, line 4). The
paper's Algorithm 2 also optimises the labels; here they come from the analytic label recovery
of :func:`recover_labels` (iDLG for one image, counting for a batch), which is exact for one
image. The update step is Adam (the paper reports first-order Adam as the stable choice for
high-dimensional inputs, Sec. 4.2) or plain gradient descent (Algorithm 2, line 13).

On CUDA (``capture``) one step — replay, distance, regulariser, gradient, Adam or SGD — is
recorded as a CUDA graph and replayed (:meth:`Qian.optimise_graph_safe`, the eager loop's
maths with its state on the device).

Measured (digits, first 4 train images, ``mlp:width=64`` untrained, 2000 Adam steps at lr 0.05,
attack seeds 0/1): orthogonality with λ₀ = 1e-5 gives 55.3 / 45.5 dB, none 45.6 / 48.0 dB,
λ₀ = 1e-4 35.8 / 35.8 dB — the regulariser must stay small, hence the default 1e-5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.capture import (
    DeviceSGD,
    DeviceSignedAdam,
    capturable,
    constant_schedule,
    run_iterations,
)
from fedleak.attacks.dlg import gradient_distance
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.registry import register_attack

REGULARISERS = ("auto", "l2", "orthogonality", "none")
OPTIMISERS = ("adam", "sgd")


@dataclass
class QianConfig:
    """Hyperparameters of Qian & Hansen's Algorithm 2."""

    iterations: int = field(default=2000, metadata={"help": "optimisation steps per restart"})
    restarts: int = field(default=1, metadata={"help": "U(0,1) inits; lowest objective wins"})
    lr: float = field(default=0.05, metadata={"help": "step size eta"})
    optimizer: str = field(
        default="adam", metadata={"help": "'adam' or 'sgd' (plain gradient descent, Alg. 2)"}
    )
    regularizer: str = field(
        default="auto",
        metadata={"help": "'auto' (l2 for one image, orthogonality for a batch), 'l2', "
                          "'orthogonality' or 'none'"},
    )
    weight: float = field(
        default=1e-5, metadata={"help": "initial regulariser weight lambda_0 (R on [0, 1] pixels)"}
    )
    decay: float = field(default=0.9, metadata={"help": "lambda <- decay * lambda every m steps"})
    decay_every: int = field(default=100, metadata={"help": "m of Algorithm 2"})
    log_every: int = field(default=50, metadata={"help": "report progress every k steps"})
    capture: bool = field(
        default=True,
        metadata={"help": "on CUDA, record one step as a CUDA graph and replay it "
                          "(falls back to eager with a notice when capture fails)"},
    )

    def __post_init__(self) -> None:
        for name in ("iterations", "restarts", "decay_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"weight must be >= 0, got {self.weight}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {self.decay}")
        if self.regularizer not in REGULARISERS:
            raise ValueError(f"regularizer must be one of {REGULARISERS}, got "
                             f"{self.regularizer!r}")
        if self.optimizer not in OPTIMISERS:
            raise ValueError(f"optimizer must be one of {OPTIMISERS}, got {self.optimizer!r}")


def l2_regularizer(images: torch.Tensor) -> torch.Tensor:
    """``‖x‖_F²``: the squared Frobenius norm of the whole batch."""
    return images.square().sum()


def orthogonality_regularizer(images: torch.Tensor) -> torch.Tensor:
    """``Σ_{k≠k'} (x_kᵀ x_{k'})²`` over ordered pairs of distinct images (each pair twice).

    With ``X`` the [n, D] matrix of flattened images and ``G = X Xᵀ`` its Gram matrix, this is
    ``‖G‖_F² − Σ_k G_kk²``.
    """
    flat = images.flatten(1)
    gram = flat @ flat.T
    return gram.square().sum() - gram.diagonal().square().sum()


def regularizer_weight(iteration: int, weight: float, decay: float, every: int) -> float:
    """``λ_i = λ₀ · decay^⌊i/m⌋`` (0-based iteration i): λ ← decay · λ every m iterations."""
    return weight * decay ** (iteration // every)


def to_pixels(images: torch.Tensor, observation: Observation) -> torch.Tensor:
    """Normalised images back on the [0, 1] pixel scale: ``x · std + mean`` per channel."""
    mean = torch.as_tensor(observation.mean, dtype=images.dtype, device=images.device)
    std = torch.as_tensor(observation.std, dtype=images.dtype, device=images.device)
    return images * std.view(1, -1, 1, 1) + mean.view(1, -1, 1, 1)


def uniform_init(observation: Observation, seed: int, device: torch.device) -> torch.Tensor:
    """U(0, 1) images in pixel space, drawn on the CPU from ``seed``, in normalised space."""
    shape = (observation.num_images, *observation.image_shape)
    pixels = torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(device)
    mean = torch.as_tensor(observation.mean, dtype=torch.float32, device=device)
    std = torch.as_tensor(observation.std, dtype=torch.float32, device=device)
    return (pixels - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


@register_attack("qian")
class Qian(Attack[Observation]):
    """Qian & Hansen's Algorithm 2: euclidean matching, U(0,1) init, decaying L2/orthogonality."""

    Config = QianConfig
    config: QianConfig

    def regularizer_name(self, num_images: int) -> str:
        """The regulariser used for a batch of ``num_images`` ('auto' resolved)."""
        if self.config.regularizer != "auto":
            return self.config.regularizer
        return "l2" if num_images == 1 else "orthogonality"

    def objective(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        observation: Observation,
        observed: list[torch.Tensor],
        iteration: int,
    ) -> torch.Tensor:
        """Gradient distance plus ``λ_i R(x)`` at ``iteration``, R on the [0, 1] pixel scale."""
        cfg = self.config
        loss = gradient_distance(observation.simulate(images, labels), observed)
        name = self.regularizer_name(images.shape[0])
        lam = regularizer_weight(iteration, cfg.weight, cfg.decay, cfg.decay_every)
        if name in ("l2", "orthogonality") and lam > 0:
            pixels = to_pixels(images, observation)
            if name == "l2":
                loss = loss + lam * l2_regularizer(pixels)
            else:
                loss = loss + lam * orthogonality_regularizer(pixels)
        return loss

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run ``restarts`` × ``iterations`` steps; keep the restart with the lowest distance.

        Restart r starts from U(0, 1) drawn from ``seed + r``. A restart that stops being
        finite ends there and keeps its last finite iterate. On CUDA (``capture``) each
        restart's step is captured as a CUDA graph (:meth:`optimise_graph_safe`).
        """
        cfg = self.config
        dev = device
        labels = recover_labels(observation).to(dev)
        observed = [u.detach().to(dev) for u in observation.update]
        total = cfg.iterations * cfg.restarts
        best: tuple[float, torch.Tensor] | None = None
        finals: list[float] = []
        notices: list[str] = []
        graph_safe = cfg.capture and capturable(dev)
        for restart in range(cfg.restarts):
            init = uniform_init(observation, seed + restart, dev)
            if graph_safe:
                images, notice = self.optimise_graph_safe(
                    init, labels, observation, observed, restart * cfg.iterations, total,
                    progress)
                notices += [notice] if notice else []
            else:
                images = self.optimise(init, labels, observation, observed,
                                       restart * cfg.iterations, total, progress)
            distance = self._distance(images, labels, observation, observed)
            finals.append(distance)
            if best is None or distance < best[0]:
                best = (distance, images)
        assert best is not None
        return Reconstruction(images=best[1], labels=labels, objective=best[0],
                              iterations=total, restart_objectives=finals,
                              warnings=notices[:1],
                              extras={"regularizer": self.regularizer_name(
                                  observation.num_images),
                                  "captured": graph_safe and not notices})

    def _distance(self, images: torch.Tensor, labels: torch.Tensor,
                  observation: Observation, observed: list[torch.Tensor]) -> float:
        leaf = images.detach().requires_grad_(True)
        value = float(gradient_distance(observation.simulate(leaf, labels), observed).item())
        return value if math.isfinite(value) else math.inf

    def optimise(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        observation: Observation,
        observed: list[torch.Tensor],
        offset: int,
        total: int,
        progress: Progress | None,
    ) -> torch.Tensor:
        """One restart with ``torch.optim`` from ``images``; returns its last finite iterate."""
        cfg = self.config
        images.requires_grad_(True)
        if cfg.optimizer == "adam":
            optimiser: torch.optim.Optimizer = torch.optim.Adam([images], lr=cfg.lr)
        else:
            optimiser = torch.optim.SGD([images], lr=cfg.lr)
        last_finite = images.detach().clone()
        for iteration in range(cfg.iterations):
            loss = self.objective(images, labels, observation, observed, iteration)
            if not bool(torch.isfinite(loss)):
                break
            last_finite = images.detach().clone()
            (images.grad,) = torch.autograd.grad(loss, images)
            optimiser.step()
            done = offset + iteration + 1
            if progress is not None and (done % cfg.log_every == 0 or iteration == 0):
                progress(done, total, float(loss.item()))
        if bool(torch.isfinite(images).all()):
            last_finite = images.detach().clone()
        return last_finite

    def optimise_graph_safe(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        observation: Observation,
        observed: list[torch.Tensor],
        offset: int,
        total: int,
        progress: Progress | None,
    ) -> tuple[torch.Tensor, str | None]:
        """:meth:`optimise`'s maths as a graph-safe step, captured as a CUDA graph on CUDA.

        λ_i is read from a device schedule at a device step counter, Adam's or SGD's state
        lives on the device (:mod:`fedleak.attacks.capture`), and the stop at a non-finite
        objective becomes a device flag: from that step on the update is masked out, so the
        images stay where the eager loop breaks, and the last finite iterate is kept in a
        static buffer. The host reads the objective and the flag every ``log_every`` steps
        (and stops there once the flag fell). Returns the result and a notice when capture
        fell back to eager.
        """
        cfg = self.config
        dev, dtype = images.device, images.dtype
        images.requires_grad_(True)
        schedule = constant_schedule(cfg.lr)
        optimiser: DeviceSignedAdam | DeviceSGD = (
            DeviceSignedAdam(images, schedule, signed=False) if cfg.optimizer == "adam"
            else DeviceSGD(images, schedule))
        name = self.regularizer_name(images.shape[0])
        regularise = name in ("l2", "orthogonality") and cfg.weight > 0
        weights = torch.tensor([regularizer_weight(i, cfg.weight, cfg.decay, cfg.decay_every)
                                for i in range(cfg.iterations)], dtype=dtype, device=dev)
        t = torch.zeros((), dtype=torch.int64, device=dev)
        alive = torch.ones((), dtype=torch.bool, device=dev)
        last = images.detach().clone()
        value = torch.zeros((), dtype=dtype, device=dev)

        def step() -> None:
            loss = gradient_distance(observation.simulate(images, labels), observed)
            if regularise:
                pixels = to_pixels(images, observation)
                penalty = (l2_regularizer(pixels) if name == "l2"
                           else orthogonality_regularizer(pixels))
                loss = loss + weights.index_select(0, t.view(1)).squeeze(0) * penalty
            (grad,) = torch.autograd.grad(loss, images)
            with torch.no_grad():
                alive.logical_and_(torch.isfinite(loss))
                last.copy_(torch.where(alive, images, last))
                value.copy_(loss)
                before = images.detach().clone()
                optimiser.step(grad)
                images.copy_(torch.where(alive, images, before))
                t.add_(1)

        def on_step(done: int) -> bool:
            if (offset + done) % cfg.log_every != 0 and done != 1:
                return False
            if not bool(alive):
                return True
            if progress is not None:
                progress(offset + done, total, float(value))
            return False

        notice = run_iterations(step, cfg.iterations, dev, capture=capturable(dev),
                                on_step=on_step)
        images.requires_grad_(False)
        result = images.detach() if bool(torch.isfinite(images).all()) else last
        return result.clone(), notice
