"""The 2-D experiment of Haim et al. (2022, Sec. 4, Fig. 2): recover 20 points on a circle.

Trains the homogeneous MLP on 20 alternating-label points on the unit circle, releases it, runs
the KKT attack with the prior off, removes small-λ candidates and duplicates (< 0.03 apart),
then prints, per training point, the distance to the nearest kept candidate, and saves the
figure (landscape, training points, candidates).

    .venv/bin/python bench/kkt_2d.py --threads 1 --out docs/img/kkt_2d.png   # 2-1000-1, 4 runs
    .venv/bin/python bench/kkt_2d.py --depth 2 --iterations 4000   # the paper's 2-1000-1000-1

The experiment itself (it lives here, with the other experiments, not in the library):
The two-dimensional experiment of Haim et al. (2022, Sec. 4, Fig. 2), end to end.

n = 20 points on the unit circle, x_i = (cos 2πi/n, sin 2πi/n), with alternating labels
y_i = +1, −1, +1, … (Fig. 2a). A homogeneous ReLU MLP (:class:`fedleak.harness.models.KKTMLP`,
bias only in the first layer) is trained on them by full-batch gradient descent on the logistic
loss until the training loss is small (:func:`fedleak.harness.release_training.train_release`);
the decision function is Fig. 2b. The KKT attack then runs with the prior off (α₃ = 0, Sec. 4)
from m random points (Fig. 2c, d); candidates with a small λ are removed (Fig. 2e) and then
duplicates closer than 0.03 to a kept point (Fig. 2f). A training point counts as recovered
when a kept candidate lies within ``recover_distance`` (0.05) of it.

Everything is reproducible from ``seed`` (model init, the attack's runs). The figure shows the
model landscape Φ(θ; x) as a filled contour with its zero level, the training points (×, red
y = +1, blue y = −1), all candidates (faint dots) and the kept ones (circles).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedleak.attacks import Progress, Reconstruction, create_attack
from fedleak.attacks.kkt.postprocess import remove_duplicates
from fedleak.harness.federated.release_training import (
    EpochCallback,
    ReleaseTrainingConfig,
    ReleaseTrainingResult,
    build_release_model,
    release,
    train_release,
)

#: KKT attack settings that recover the circle: four Adam runs pooled (see bench/kkt_2d.py;
#: one run leaves one point 0.09 away, two runs 0.065, four runs all 20 within 0.03).
DEFAULT_ATTACK_OPTIONS: dict[str, Any] = {
    "optimizer": "adam",
    "iterations": 8000,
    "runs": 4,
    "num_candidates": 100,
    "lambda_init": 0.1,
    "lr_low": 3e-3,
    "lr_high": 3e-3,
    "sigma_x_low": 0.3,
    "sigma_x_high": 0.3,
    "alpha_low": 150.0,
    "alpha_high": 150.0,
    "lambda_min_low": 1e-4,
    "lambda_min_high": 1e-4,
    "alpha3": 0.0,
}


@dataclass
class CircleExperimentConfig:
    """Sizes and budgets of the 2-D experiment; defaults follow Sec. 4 where it says."""

    n: int = 20
    width: int = 1000
    depth: int = 1
    init_std: float = 1e-4
    training: ReleaseTrainingConfig = field(
        default_factory=lambda: ReleaseTrainingConfig(
            lr=0.05, max_epochs=200_000, target_loss=1e-3, report_every=1000
        )
    )
    attack_options: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_ATTACK_OPTIONS))
    lambda_threshold: float = 0.0
    min_distance: float = 0.03
    recover_distance: float = 0.05
    seed: int = 0


@dataclass
class CircleExperimentResult:
    """Training points, every candidate, the kept ones, and how close each point came."""

    points: Tensor
    labels: Tensor
    candidates: Tensor
    lambdas: Tensor
    kept: Tensor
    distances: Tensor
    recovered: int
    model: nn.Module
    training: ReleaseTrainingResult
    reconstruction: Reconstruction
    config: CircleExperimentConfig

    @property
    def kept_candidates(self) -> Tensor:
        """The candidates that survive λ filtering and de-duplication, ``[K, 2]``."""
        return self.candidates[self.kept]


def circle_points(n: int = 20) -> tuple[Tensor, Tensor]:
    """``n`` points on the unit circle at angles 2πi/n and labels +1, −1, +1, … (Fig. 2a)."""
    if n < 2 or n % 2:
        raise ValueError(f"n must be even and >= 2 for alternating labels, got {n}")
    angles = torch.arange(n, dtype=torch.float64) * 2 * math.pi / n
    points = torch.stack([angles.cos(), angles.sin()], dim=1).float()
    labels = torch.tensor([1.0, -1.0]).repeat(n // 2)
    return points, labels


def run_circle_experiment(
    config: CircleExperimentConfig | None = None,
    *,
    on_epoch: EpochCallback | None = None,
    progress: Progress | None = None,
) -> CircleExperimentResult:
    """Train on the circle, attack the released model, filter and de-duplicate (Sec. 4)."""
    config = config or CircleExperimentConfig()
    points, labels = circle_points(config.n)
    model = build_release_model(
        (2,), width=config.width, depth=config.depth, init_std=config.init_std, seed=config.seed
    )
    training = train_release(model, points, labels, config.training, on_epoch=on_epoch)
    released = release(model, (2,), config.n, metadata={"experiment": "circle-2d"})
    attack = create_attack("kkt", dict(config.attack_options))
    reconstruction = attack.reconstruct(released, seed=config.seed, progress=progress)
    candidates = reconstruction.images.reshape(-1, 2)
    lambdas = reconstruction.extras["lambdas"]
    large = torch.nonzero(lambdas > config.lambda_threshold).flatten()
    kept = large[remove_duplicates(candidates[large], lambdas[large], config.min_distance)]
    if len(kept):
        distances = torch.cdist(points.double(), candidates[kept].double()).min(1).values
    else:
        distances = torch.full((config.n,), math.inf, dtype=torch.float64)
    return CircleExperimentResult(
        points=points,
        labels=labels,
        candidates=candidates,
        lambdas=lambdas,
        kept=kept,
        distances=distances,
        recovered=int((distances < config.recover_distance).sum()),
        model=model,
        training=training,
        reconstruction=reconstruction,
        config=config,
    )


def plot_circle_experiment(
    result: CircleExperimentResult, path: str | Path | None = None, *, grid: int = 200
) -> Any:
    """Fig. 2 in one panel: landscape Φ(θ; x), training points, candidates, kept candidates.

    Returns the matplotlib figure (Agg backend) and saves it to ``path`` when given.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    extent = 1.6
    axis = torch.linspace(-extent, extent, grid)
    xx, yy = torch.meshgrid(axis, axis, indexing="xy")
    with torch.no_grad():
        values = result.model(torch.stack([xx.flatten(), yy.flatten()], 1)).reshape(grid, grid)
    figure, ax = plt.subplots(figsize=(6, 6))
    limit = float(values.abs().max())
    ax.contourf(xx, yy, values, levels=30, cmap="coolwarm", vmin=-limit, vmax=limit, alpha=0.6)
    ax.contour(xx, yy, values, levels=[0.0], colors="k", linewidths=0.8)
    cand = result.candidates.detach()
    ax.scatter(cand[:, 0], cand[:, 1], s=6, c="0.4", alpha=0.5, label="all candidates")
    kept = result.kept_candidates.detach()
    ax.scatter(kept[:, 0], kept[:, 1], s=60, facecolors="none", edgecolors="g",
               label="kept candidates")
    colours = ["tab:red" if v > 0 else "tab:blue" for v in result.labels.tolist()]
    ax.scatter(result.points[:, 0], result.points[:, 1], marker="x", s=50, c=colours,
               label="training points")
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
    ax.set_aspect("equal")
    ax.set_title(f"KKT reconstruction: {result.recovered}/{len(result.points)} points within "
                 f"{result.config.recover_distance}")
    ax.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=120)
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--train-lr", type=float, default=0.1)
    parser.add_argument("--max-epochs", type=int, default=400_000)
    parser.add_argument("--target-loss", type=float, default=1e-3)
    parser.add_argument("--iterations", type=int, default=DEFAULT_ATTACK_OPTIONS["iterations"])
    parser.add_argument("--attack", type=json.loads, default={}, help="JSON of kkt options")
    parser.add_argument("--lambda-threshold", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench_out/kkt_2d.png"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    options = {**DEFAULT_ATTACK_OPTIONS, "iterations": args.iterations, "sigma_x_low": 1.0,
               "sigma_x_high": 1.0, **args.attack}
    config = CircleExperimentConfig(
        n=args.n, width=args.width, depth=args.depth,
        training=ReleaseTrainingConfig(lr=args.train_lr, max_epochs=args.max_epochs,
                                       target_loss=args.target_loss, report_every=10_000),
        attack_options=options, lambda_threshold=args.lambda_threshold, seed=args.seed,
    )
    start = time.perf_counter()
    marks = {"trained": 0.0}

    def on_epoch(epoch: int, loss: float, accuracy: float) -> None:
        marks["trained"] = time.perf_counter() - start
        if epoch % 50_000 == 0:
            print(f"epoch {epoch}: loss {loss:.3e}, train accuracy {accuracy:.2f}", flush=True)

    def progress(done: int, total: int, objective: float) -> None:
        if done % max(1, total // 4) == 0 or done == total:
            print(f"attack {done}/{total}: objective {objective:.4g}", flush=True)

    result = run_circle_experiment(config, on_epoch=on_epoch, progress=progress)
    wall = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_circle_experiment(result, args.out)
    print(json.dumps({"attack_options": options}))
    print(f"training: {result.training.epochs} epochs, loss {result.training.loss:.2e}, "
          f"accuracy {result.training.train_accuracy:.2f}, {marks['trained']:.0f} s")
    print(f"attack + post-processing: {wall - marks['trained']:.0f} s; "
          f"{len(result.candidates)} candidates, {len(result.kept)} kept")
    for i, (point, distance) in enumerate(zip(result.points, result.distances, strict=True)):
        print(f"point {i:2d} ({point[0]:+.3f}, {point[1]:+.3f}) y={int(result.labels[i]):+d}: "
              f"nearest kept candidate {float(distance):.4f}")
    print(f"recovered (< {config.recover_distance}): {result.recovered}/{len(result.points)}; "
          f"max distance {float(result.distances.max()):.4f}; figure {args.out}")


if __name__ == "__main__":
    main()
