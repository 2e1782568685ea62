"""The 2-D experiment of Haim et al. (2022, Sec. 4, Fig. 2): recover 20 points on a circle.

Trains the homogeneous MLP on 20 alternating-label points on the unit circle, releases it, runs
the KKT attack with the prior off, removes small-λ candidates and duplicates (< 0.03 apart),
then prints, per training point, the distance to the nearest kept candidate, and saves the
figure (landscape, training points, candidates).

    .venv/bin/python bench/kkt_2d.py --threads 1 --out docs/img/kkt_2d.png   # 2-1000-1, 4 runs
    .venv/bin/python bench/kkt_2d.py --depth 2 --iterations 4000   # the paper's 2-1000-1000-1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fedleak.harness.kkt_2d import (
    DEFAULT_ATTACK_OPTIONS,
    CircleExperimentConfig,
    plot_circle_experiment,
    run_circle_experiment,
)
from fedleak.harness.release_training import ReleaseTrainingConfig


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
