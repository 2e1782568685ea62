"""Seconds per 1000 iterations of the KKT attack on a released digits ``kkt-mlp``.

One iteration is one evaluation of eq. (8) for all m = 2n candidates (forward, ∇_θ Φ summed
with ``create_graph``, the double backward to x and λ) and one optimiser step. For n = 50 and
n = 100 (m = 100, 200) on 1×8×8 digits (d = 64) and the paper's d–1000–1000–1 network
(``--depth 1`` for d–1000–1), the attack runs ``--iterations`` steps through its real code
path (``create_attack("kkt").reconstruct``); the time is read from the progress callback after
a warm-up window. On CUDA the step is captured as a CUDA graph (``--no-capture``: eager).
``--runs K --pack K`` optimises K runs of the search as one packed computation (``--pack 1``:
one after another); the figure is then per 1000 run-iterations.

    .venv/bin/python bench/kkt_speed.py                        # CPU
    .venv/bin/python bench/kkt_speed.py --device cuda --iterations 2000
    .venv/bin/python bench/kkt_speed.py --device cuda --iterations 2000 --no-capture
    .venv/bin/python bench/kkt_speed.py --runs 8 --pack 8      # against --runs 8 --pack 1
"""

from __future__ import annotations

import argparse
import time

import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.release_training import build_release_model, release

SHAPE = (1, 8, 8)


def seconds_per_1000(n: int, args: argparse.Namespace) -> float:
    model = build_release_model(SHAPE, width=args.width, depth=args.depth, seed=0)
    released = release(model, SHAPE, n)  # the attack moves θ and its model copy to the device
    stamps: list[tuple[int, float]] = []

    def progress(done: int, total: int, objective: float) -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        stamps.append((done, time.perf_counter()))

    options = {"iterations": args.iterations, "log_every": args.window, "lr_low": 1e-5,
               "lr_high": 1e-5, "sigma_x_low": args.sigma_x, "sigma_x_high": args.sigma_x,
               "float64": args.float64, "optimizer": args.optimizer,
               "capture": not args.no_capture, "runs": args.runs, "pack": args.pack}
    create_attack("kkt", options).reconstruct(released, device=args.device, progress=progress)
    (first, t0), (last, t1) = stamps[1], stamps[-1]
    return (t1 - t0) / (last - first) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--float64", action="store_true")
    parser.add_argument("--n", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--sigma-x", type=float, default=0.01,
                        help="init scale of the candidates (float32 with a tiny one meets "
                        "subnormal numbers, which are slow on CPUs)")
    parser.add_argument("--runs", type=int, default=1, help="runs of the random search")
    parser.add_argument("--pack", type=int, default=1, help="runs per packed computation")
    parser.add_argument("--no-capture", action="store_true",
                        help="run the eager loop on CUDA instead of the captured step")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device {args.device}, threads {torch.get_num_threads()}, d=64, "
          f"kkt-mlp width {args.width} depth {args.depth}, "
          f"{'float64' if args.float64 else 'float32'}, {args.optimizer}, "
          f"{args.runs} run(s) in packs of {args.pack}, "
          f"capture {'off' if args.no_capture else 'on (CUDA only)'}")
    for n in args.n:
        seconds = seconds_per_1000(n, args)
        unit = "run-iterations" if args.runs > 1 else "iterations"
        print(f"n={n:4d} (m={2 * n}): {seconds:.2f} s per 1000 {unit} "
              f"({seconds:.2f} ms per {unit[:-1]})", flush=True)


if __name__ == "__main__":
    main()
