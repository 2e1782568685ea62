"""Every preset with the compiled objective step against the eager engine: result and start cost.

For each preset (its defaults, plus the options below) on one FedSGD round of ``--model`` on
``--images`` random 3×32×32 images, the attack runs ``--iterations`` steps eagerly and with
``compile=on``, from the same seed, in this process. Printed: the largest difference of the
reconstructed images (normalised space) and of the restart objectives, whether the compiled
step ran (no fallback notice), and the extra CPU seconds of the compiled run over the eager
one — the compile (first run on a machine and structure) or loading the saved step (later
runs: run the script twice; the saved steps and Inductor's caches live in the fedleak cache
dir, :func:`fedleak.attacks.optimisation.engine.compiled.compile_cache_dir`). Presets whose
step has the same structure share one saved step (``inverting-gradients`` with and without
``signed``: the optimiser is not in the step). "extra CPU s" is this process's CPU time;
"+ children" adds the CPU of the subprocesses that ended meanwhile (the C++ compiler on a first
run; Inductor's vector-ISA probe, once per machine), and "wall s" is the compiled run's wall
time.

    .venv/bin/python bench/compiled_presets.py                 # every preset, lenet-zhu, n=1
    .venv/bin/python bench/compiled_presets.py --presets inverting-gradients --iterations 50

``n/a``: the preset's optimiser is L-BFGS, whose closure always runs eagerly. Sign-fed
optimisers hide rounding (a sign rarely flips), so the differences are also shown for
``inverting-gradients`` with ``signed=false`` (plain Adam).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.zoo.datasets import DatasetInfo
from fedleak.harness.zoo.models import build_model

PRESETS: dict[str, dict[str, Any]] = {
    "inverting-gradients": {},
    "inverting-gradients:signed=false": {"signed": False},
    "qian": {},
    "gradinversion": {"restarts": 2, "bn": 0.0},
    "dlg": {},
}


def children_cpu() -> float:
    """User and system CPU seconds of this process's ended subprocesses."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--model", default="lenet-zhu")
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = (3, 32, 32)
    model = build_model(args.model, shape, 10)
    info = DatasetInfo("random", shape, 10, (0.5,) * 3, (0.5,) * 3, ())
    images = torch.rand(args.images, *shape)
    target = observe(model, images, (torch.arange(args.images) + 3) % 10, info)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, one thread, load average {load}, {args.model} "
          f"n={args.images}, {args.iterations} iterations")
    print(f"{'preset':<34} {'max |Δx|':>10} {'max |ΔF|':>10} {'compiled':>9} "
          f"{'extra CPU s':>12} {'+ children':>11} {'wall s':>7}")
    for key in args.presets:
        name = key.split(":")[0]
        options = {"iterations": args.iterations, **PRESETS.get(key, {})}
        runs, spent, children = [], [], []
        for compiled in (False, True):
            start, kids, wall = time.process_time(), children_cpu(), time.perf_counter()
            runs.append(create_attack(name, {**options, "compile": compiled}).reconstruct(
                target, device="cpu", seed=0))
            spent.append(time.process_time() - start)
            children.append(children_cpu() - kids)
            wall = time.perf_counter() - wall
        eager, fast = runs
        dx = (fast.images - eager.images).abs().max().item()
        df = max(abs(a - b) for a, b in zip(fast.restart_objectives, eager.restart_objectives,
                                            strict=True))
        ran = "fallback" if any("compile failed" in w for w in fast.warnings) else "yes"
        if fast.extras.get("optimizer") == "lbfgs":
            ran = "n/a"  # L-BFGS runs its closure eagerly: compile=on changes nothing
        extra = spent[1] - spent[0]
        print(f"{key:<34} {dx:>10.2e} {df:>10.2e} {ran:>9} {extra:>12.1f} "
              f"{extra + children[1] - children[0]:>11.1f} {wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
