"""Milliseconds per iteration of the Inverting Gradients attack, through its real code path.

For each model, an observation is built as the harness builds it (model zoo, the victim's
``local_update``, the attacker's ``UpdateSimulator``) for one random 3×32×32 image, and
``create_attack("inverting-gradients", ...).reconstruct`` runs one restart on it. The progress
callback (every ``--window`` iterations; it reads the objective, which synchronises the device)
timestamps windows; the table shows the median and the fastest window after the first
(warm-up) one, in ms per iteration.

``--straightforward`` times, on the same observation, the textbook loop the attack replaced:
``torch.optim.Adam`` + ``MultiStepLR``, the cosine of two ``torch.cat`` vectors through autograd,
``.item()`` every step, and PyTorch's own second derivatives (``local_update`` called directly).

    .venv/bin/python bench/attack_speed.py                       # CPU, default threads
    .venv/bin/python bench/attack_speed.py --straightforward     # the 'before' numbers
    .venv/bin/python bench/attack_speed.py --device cuda --window 50
    .venv/bin/python bench/attack_speed.py --threads 2 --models lenet-zhu   # + restarts, batches

After the single-image table come two more (skip them with ``--restarts 0 --batch-sizes``):
R = 8 restarts on one image, vectorised (one batched replay under ``torch.func.vmap``) against
one after the other, in ms per iteration of all R restarts together; and one restart on
batches of 8 and 100 images.

Targets on a 2-core CPU: ≤ 4 ms/iteration for lenet-zhu, ≤ 100 ms for resnet20-4; R = 8
vectorised restarts ≥ 3× faster than sequential ones for lenet-zhu. Other
processes on a 2-core machine distort two-thread timings badly (OpenMP barriers wait for a
descheduled thread): the load average is printed, and the fastest window is the figure least
affected by such noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from fedleak.attacks import Observation, create_attack
from fedleak.attacks.optimisation.presets.inverting_gradients import (
    decay_milestones,
    total_variation,
)
from fedleak.harness.federated.local_update import UpdateSimulator, local_update
from fedleak.harness.federated.observe import observe
from fedleak.harness.zoo.datasets import DatasetInfo
from fedleak.harness.zoo.models import build_model

DEFAULT_ITERATIONS = {"lenet-zhu": 300, "resnet20-4": 40}
SHAPE = (3, 32, 32)
NUM_CLASSES = 10


def observation_for(
    model_name: str, device: str, seed: int = 0, num_images: int = 1
) -> Observation:
    """One FedSGD round of ``model_name`` on ``num_images`` random images (labels 3, 4, …
    modulo 10), as the harness would see it."""
    torch.manual_seed(seed)
    model = build_model(model_name, SHAPE, NUM_CLASSES).to(device)
    images = torch.rand(num_images, *SHAPE, device=device)  # on [0, 1]; normalised to [-1, 1]
    labels = (torch.arange(num_images, device=device) + 3) % NUM_CLASSES
    info = DatasetInfo("random", SHAPE, NUM_CLASSES, (0.5,) * 3, (0.5,) * 3, ())
    return observe(model, images, labels, info)


def window_rates(stamps: list[tuple[int, float]], window: int) -> list[float]:
    """ms per iteration of each window after the first."""
    marks = [s for s in stamps if s[0] % window == 0]
    return [
        (t1 - t0) / (i1 - i0) * 1e3
        for (i0, t0), (i1, t1) in zip(marks[:-1], marks[1:], strict=True)
    ]


def time_attack(
    observation: Observation, device: str, iterations: int, window: int,
    restarts: int = 1, vectorised: bool = True,
) -> list[float]:
    """Window rates of the registered attack's ``reconstruct``, in ms per restart-iteration
    (with R restarts, multiply by R for the time of one step of all of them)."""
    stamps: list[tuple[int, float]] = []

    def progress(iteration: int, total: int, objective: float) -> None:
        stamps.append((iteration, time.perf_counter()))

    options = {"iterations": iterations, "log_every": window, "restarts": restarts,
               "vectorised": vectorised}
    attack = create_attack("inverting-gradients", options)
    attack.reconstruct(observation, device=device, seed=0, progress=progress)
    if restarts > 1 and vectorised:  # progress counts R restart-iterations per step
        return window_rates(stamps, window * restarts)
    return window_rates(stamps, window)


def restarts_table(models: list[str], device: str, restarts: int, iterations: int,
                   window: int) -> None:
    """ms per step of all R restarts (one image each), vectorised vs one after the other."""
    print(f"\n{restarts} restarts, 1 image, {iterations} iterations each: ms per iteration of "
          "all restarts together (median / fastest window)")
    print(f"{'model':<12} {'vectorised':>17} {'sequential':>17} {'speed-up':>9}")
    for name in models:
        observation = observation_for(name, device)
        rates = {}
        for vectorised in (True, False):
            found = time_attack(observation, device, iterations, window, restarts, vectorised)
            rates[vectorised] = [r * restarts for r in found]
        fast, slow = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"{name:<12} {fast:>8.2f} / {min(rates[True]):>6.2f} "
              f"{slow:>8.2f} / {min(rates[False]):>6.2f} {slow / fast:>8.2f}x")


def batches_table(models: list[str], device: str, sizes: list[int], iterations: int,
                  window: int) -> None:
    """ms per iteration of one restart on batches of n images."""
    print(f"\nbatches, one restart, {iterations} iterations: ms per iteration "
          "(median / fastest window)")
    print(f"{'model':<12} {'images':>7} {'median ms/it':>13} {'fastest ms/it':>14}")
    for name in models:
        for size in sizes:
            observation = observation_for(name, device, num_images=size)
            rates = time_attack(observation, device, iterations, window)
            print(f"{name:<12} {size:>7} {statistics.median(rates):>13.2f} {min(rates):>14.2f}")


def time_straightforward(
    observation: Observation, device: str, iterations: int, window: int
) -> list[float]:
    """Window rates of the textbook implementation (see the module docstring)."""
    simulator = observation.simulate
    assert isinstance(simulator, UpdateSimulator)

    def replay(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return local_update(simulator.model, simulator.parameters, simulator.buffers, x, y,
                            simulator.protocol, create_graph=True)

    labels = torch.tensor([3], device=device)
    lower, upper = observation.image_bounds(device)
    observed = torch.cat([u.flatten() for u in observation.update])
    x = torch.randn(1, *SHAPE, device=device).requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=0.1)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimiser, list(decay_milestones(iterations)), gamma=0.1
    )
    stamps: list[tuple[int, float]] = []
    for i in range(iterations):
        optimiser.zero_grad()
        candidate = torch.cat([g.flatten() for g in replay(x, labels)])
        loss = 1 - torch.nn.functional.cosine_similarity(candidate, observed, dim=0)
        loss = loss + 1e-2 * total_variation(x)
        loss.backward()
        x.grad.sign_()
        optimiser.step()
        scheduler.step()
        with torch.no_grad():
            x.data = torch.max(torch.min(x, upper), lower)
        loss.item()
        stamps.append((i + 1, time.perf_counter()))
    return window_rates(stamps, window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_ITERATIONS))
    parser.add_argument("--iterations", type=int, default=0, help="0: per-model default")
    parser.add_argument("--window", type=int, default=10, help="iterations per timed window")
    parser.add_argument("--threads", type=int, default=0, help="0: leave torch's default")
    parser.add_argument("--straightforward", action="store_true",
                        help="time the textbook implementation instead")
    parser.add_argument("--restarts", type=int, default=8,
                        help="R for the vectorised-vs-sequential restarts table (0: skip it)")
    parser.add_argument("--restart-models", nargs="+", default=["lenet-zhu"])
    parser.add_argument("--restart-iterations", type=int, default=60)
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[8, 100],
                        help="images per batch for the batches table (none: skip it)")
    parser.add_argument("--batch-models", nargs="+", default=["lenet-zhu"])
    parser.add_argument("--batch-iterations", type=int, default=40)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    timer: Callable[..., list[float]] = (
        time_straightforward if args.straightforward else time_attack
    )
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
          f"load average {load}, {'straightforward' if args.straightforward else 'fedleak'}")
    print(f"{'model':<12} {'iterations':>10} {'median ms/it':>13} {'fastest ms/it':>14}")
    for name in args.models:
        iterations = args.iterations or DEFAULT_ITERATIONS.get(name, 40)
        observation = observation_for(name, args.device)
        rates = timer(observation, args.device, iterations, args.window)
        print(f"{name:<12} {iterations:>10} {statistics.median(rates):>13.2f} "
              f"{min(rates):>14.2f}")
    if args.straightforward:
        return
    if args.restarts > 1:
        restarts_table(args.restart_models, args.device, args.restarts,
                       args.restart_iterations, args.window)
    if args.batch_sizes:
        batches_table(args.batch_models, args.device, args.batch_sizes, args.batch_iterations,
                      args.window)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\nload average at the end: {load}")


if __name__ == "__main__":
    main()
