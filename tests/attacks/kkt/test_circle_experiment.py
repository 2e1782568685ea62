"""The 2-D experiment of Haim et al. (2022, Sec. 4, Fig. 2), which lives in bench/kkt_2d.py."""

from __future__ import annotations

import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.release_training import ReleaseTrainingConfig, release
from tests.helpers import load_bench_script

experiment = load_bench_script("kkt_2d")
CircleExperimentConfig = experiment.CircleExperimentConfig
circle_points = experiment.circle_points
run_circle_experiment = experiment.run_circle_experiment


def test_two_dimensional_experiment_recovers_the_circle() -> None:
    """A small version of Fig. 2: 12 points, a 2-300-1 network, 2000 Adam steps."""
    attack = {"optimizer": "adam", "iterations": 2000, "num_candidates": 60, "lambda_init": 0.1,
              "lr_low": 3e-3, "lr_high": 3e-3, "sigma_x_low": 1.0, "sigma_x_high": 1.0,
              "alpha_low": 150.0, "alpha_high": 150.0, "lambda_min_low": 1e-4,
              "lambda_min_high": 1e-4, "alpha3": 0.0, "log_every": 500}
    config = CircleExperimentConfig(
        n=12, width=300, depth=1,
        training=ReleaseTrainingConfig(lr=0.1, max_epochs=50_000, target_loss=3e-3),
        attack_options=attack,
    )
    result = run_circle_experiment(config)
    assert result.training.reached_target and result.training.train_accuracy == 1.0
    # The same search stopped after one step: the random initialisation (Fig. 2c).
    released = release(result.model, (2,), 12)
    initial = create_attack("kkt", {**attack, "iterations": 1}).reconstruct(released).images
    initial_distances = torch.cdist(result.points, initial).min(1).values
    assert float(result.distances.max()) < 0.25
    assert float(result.distances.median()) < 0.12
    assert float(result.distances.median()) < 0.6 * float(initial_distances.median())


def test_circle_points_alternate() -> None:
    points, labels = circle_points(20)
    assert torch.allclose(points.norm(dim=1), torch.ones(20))
    assert labels.tolist() == [1.0, -1.0] * 10
