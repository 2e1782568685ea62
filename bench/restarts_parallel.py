"""Wall time of an attack's restarts in one process vs split across worker processes.

``inverting-gradients`` (FedSGD, one random 3×32×32 image, lenet-zhu by default) with R
restarts and T iterations, timed as **wall time** of ``reconstruct`` (workers run in other
processes, so the parent's CPU time says nothing), one intra-op thread per process, for each
``--workers`` value, interleaved ``--repeats`` times; the min per value is the figure (other
processes on a shared machine only slow a run down). Also checks that every value gives the
same restart objectives as the first.

    .venv/bin/python bench/restarts_parallel.py                   # lenet-zhu R8 T200, 1 vs 2
    .venv/bin/python bench/restarts_parallel.py --restarts 4 --workers 1 2 4 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from fedleak.attacks import Observation, create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.zoo.datasets import DatasetInfo
from fedleak.harness.zoo.models import build_model


def observation_for(model_name: str, seed: int = 0) -> Observation:
    """One FedSGD round of ``model_name`` on one random 3×32×32 image (label 3)."""
    torch.manual_seed(seed)
    shape = (3, 32, 32)
    model = build_model(model_name, shape, 10)
    info = DatasetInfo("random", shape, 10, (0.5,) * 3, (0.5,) * 3, ())
    return observe(model, torch.rand(1, *shape), torch.tensor([3]), info)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet-zhu")
    parser.add_argument("--restarts", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vectorised", choices=("on", "off"), default="on")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    observation = observation_for(args.model)
    options = {"iterations": args.iterations, "restarts": args.restarts,
               "vectorised": args.vectorised == "on"}
    times: dict[int, list[float]] = {w: [] for w in args.workers}
    objectives: dict[int, list[float]] = {}
    print(f"{args.model} R={args.restarts} T={args.iterations} vectorised={args.vectorised} "
          f"seed={args.seed}; load average at start {os.getloadavg()}")
    for repeat in range(args.repeats):
        for w in args.workers:
            attack = create_attack("inverting-gradients", {**options, "workers": w})
            start = time.perf_counter()
            result = attack.reconstruct(observation, seed=args.seed)
            times[w].append(time.perf_counter() - start)
            objectives.setdefault(w, result.restart_objectives)
            print(f"  repeat {repeat} workers={w}: {times[w][-1]:.2f} s wall, "
                  f"best objective {result.objective:.6f}", flush=True)
    first = args.workers[0]
    for w in args.workers:
        gap = max(abs(a - b) for a, b in zip(objectives[w], objectives[first], strict=True))
        median = sorted(times[w])[len(times[w]) // 2]
        print(f"workers={w}: min {min(times[w]):.2f} s, median {median:.2f} s, "
              f"speed-up (min) {min(times[first]) / min(times[w]):.2f}x, "
              f"max |Δ restart objective| vs workers={first}: {gap:.2e}")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
