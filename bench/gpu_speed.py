"""The attack engine at the speed of the GPU: ms per iteration, eager against captured.

For each model, at batch 1 (one random 3×32×32 image, FedSGD, untrained, seed 0), prints ms
per iteration of:

- ``straightforward``: the textbook loop (``torch.optim.Adam`` + ``MultiStepLR``, the cosine of
  two concatenated vectors through autograd, PyTorch's own double backward, ``.item()`` every
  step) — the eager reference;
- ``fedleak``: the registered ``inverting-gradients`` attack, one restart (captured as a CUDA
  graph on a GPU, ``capture=true``; eager elsewhere or with ``--no-capture``);
- ``R = 8``: eight restarts of one image as one vectorised (and captured) computation;
- ``8 packed``: eight independent images (eight rounds, each its own θ) attacked as one packed
  computation (``reconstruct_many``), against one of them alone;

then the wall time of one paper-budget attack (``--paper-iterations``, 24,000 by default) on
resnet20-4, and the device it ran on. ``--batchnorm eval`` measures the BatchNorm models with
running statistics (Geiping et al.'s setting); by default they normalise with the batch's.

    .venv/bin/python bench/gpu_speed.py --device cuda                 # the issue's table
    .venv/bin/python bench/gpu_speed.py --device cpu --models lenet-zhu --paper-iterations 0
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from attack_speed import observation_for, time_straightforward, window_rates

from fedleak.attacks import create_attack
from fedleak.harness.federated.protocol import Protocol

MODELS = ("lenet-zhu", "convnet:width=64", "resnet20-4", "resnet32-10")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fedleak_rates(observation: object, device: str, iterations: int, window: int,
                  restarts: int = 1, capture: bool = True) -> list[float]:
    """ms per step (all restarts together) of the registered attack."""
    stamps: list[tuple[int, float]] = []

    def progress(done: int, total: int, objective: float) -> None:
        stamps.append((done // restarts, time.perf_counter()))

    attack = create_attack("inverting-gradients", {
        "iterations": iterations, "log_every": window, "restarts": restarts,
        "capture": capture})
    attack.reconstruct(observation, device=device, seed=0, progress=progress)  # type: ignore[arg-type]
    return window_rates(stamps, window)


def packed_ms(observations: list, device: str, iterations: int, capture: bool) -> float:
    """ms per iteration of all observations attacked as one packed computation."""
    attack = create_attack("inverting-gradients", {"iterations": iterations,
                                                   "capture": capture, "log_every": iterations})
    attack.reconstruct_many(observations[:1], device=device)  # warm-up
    sync(device)
    started = time.perf_counter()
    attack.reconstruct_many(observations, device=device)
    sync(device)
    return (time.perf_counter() - started) / iterations * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--paper-iterations", type=int, default=24_000)
    parser.add_argument("--batchnorm", choices=("train", "eval"), default="train")
    parser.add_argument("--no-capture", action="store_true")
    args = parser.parse_args()
    device, capture = args.device, not args.no_capture
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"device: {device} ({name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, BatchNorm {args.batchnorm}, "
          f"capture {'on' if capture else 'off'}")
    protocol = Protocol(batchnorm=args.batchnorm)
    print(f"{'model':<18} {'straightforward':>16} {'fedleak':>9} {'R = 8 (all)':>12} "
          f"{'1 alone':>9} {'8 packed':>9}   ms/it")
    for model in args.models.split(","):
        observation = observation_for(model, device)
        if args.batchnorm != "train":
            observation.simulate.protocol = protocol  # type: ignore[attr-defined]
        plain = statistics.median(time_straightforward(observation, device, args.iterations,
                                                       args.window))
        ours = statistics.median(fedleak_rates(observation, device, args.iterations,
                                               args.window, capture=capture))
        eight = statistics.median(fedleak_rates(observation, device, args.iterations,
                                                args.window, restarts=8, capture=capture))
        rounds = [observation_for(model, device, seed=s) for s in range(8)]
        alone = packed_ms(rounds[:1], device, args.iterations, capture)
        packed = packed_ms(rounds, device, args.iterations, capture)
        print(f"{model:<18} {plain:>16.2f} {ours:>9.2f} {eight:>12.2f} {alone:>9.2f} "
              f"{packed:>9.2f}")
    if args.paper_iterations:
        observation = observation_for("resnet20-4", device)
        attack = create_attack("inverting-gradients", {
            "iterations": args.paper_iterations, "capture": capture, "log_every": 1000})
        sync(device)
        started = time.perf_counter()
        attack.reconstruct(observation, device=device)
        sync(device)
        print(f"paper budget: {args.paper_iterations} iterations of resnet20-4 in "
              f"{time.perf_counter() - started:.1f} s on {device}")


if __name__ == "__main__":
    main()
