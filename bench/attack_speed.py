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

Targets on a 2-core CPU: ≤ 4 ms/iteration for lenet-zhu, ≤ 100 ms for resnet20-4. Other
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
from fedleak.attacks.inverting_gradients import decay_milestones, total_variation
from fedleak.harness.models import build_model
from fedleak.harness.protocol import Protocol, UpdateSimulator, local_update

DEFAULT_ITERATIONS = {"lenet-zhu": 300, "resnet20-4": 40}
SHAPE = (3, 32, 32)
NUM_CLASSES = 10


def observation_for(model_name: str, device: str, seed: int = 0) -> Observation:
    """One FedSGD round of ``model_name`` on one random image, as the harness would see it."""
    torch.manual_seed(seed)
    model = build_model(model_name, SHAPE, NUM_CLASSES).to(device)
    parameters = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    images = torch.rand(1, *SHAPE, device=device) * 2 - 1
    labels = torch.tensor([3], device=device)
    protocol = Protocol()
    return Observation(
        parameter_names=list(parameters),
        parameters=[p.detach() for p in parameters.values()],
        update=local_update(model, parameters, buffers, images, labels, protocol),
        update_kind=protocol.update_kind(),
        num_images=1,
        image_shape=SHAPE,
        num_classes=NUM_CLASSES,
        mean=[0.5] * 3,
        std=[0.5] * 3,
        simulate=UpdateSimulator(model, parameters, buffers, protocol),
    )


def window_rates(stamps: list[tuple[int, float]], window: int) -> list[float]:
    """ms per iteration of each window after the first."""
    marks = [s for s in stamps if s[0] % window == 0]
    return [
        (t1 - t0) / (i1 - i0) * 1e3
        for (i0, t0), (i1, t1) in zip(marks[:-1], marks[1:], strict=True)
    ]


def time_attack(observation: Observation, device: str, iterations: int, window: int) -> list[float]:
    """Window rates of the registered attack's ``reconstruct``."""
    stamps: list[tuple[int, float]] = []

    def progress(iteration: int, total: int, objective: float) -> None:
        stamps.append((iteration, time.perf_counter()))

    attack = create_attack("inverting-gradients", {"iterations": iterations, "log_every": window})
    attack.reconstruct(observation, device=device, seed=0, progress=progress)
    return window_rates(stamps, window)


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


if __name__ == "__main__":
    main()
