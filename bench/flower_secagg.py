"""Leakage of one Flower round with and without SecAgg+, same nodes, images, θ and attack.

Three ``fedleak flower simulate`` runs (Flower's simulation engine, one torch thread per node),
each one round of FedAvg with one local step (one epoch over the node's whole batch, τ = 0.1,
so a node's update is −τ times its mean gradient and the SecAgg+ aggregate replays exactly as
one step over the pooled batch):

1. no SecAgg+: the audit attacks every node's update alone (n images each), scored on its node;
2. ``--secagg-plus`` with max weight n (fedleak's default: the finest quantisation SecAgg+
   allows): the audit sees only the aggregate of the K nodes and attacks it as one batch of
   K·n images; every node scores its own images among the reconstruction;
3. the same with Flower's own default max weight 1000 (1000/n times coarser quantisation).

It prints the mean PSNR / SSIM of each (over all K·n images), and for the SecAgg+ runs the
quantisation bound per entry and how the nodes' matchings combined.

    .venv/bin/python bench/flower_secagg.py --nodes 3 --images 1 --iterations 300
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flower_overhead import FEDLEAK, timed  # noqa: E402


def simulate(args: argparse.Namespace, out: Path, *extra: str) -> tuple[float, dict[str, Any]]:
    wall = timed([*FEDLEAK, "flower", "simulate", "--nodes", str(args.nodes), "--rounds", "1",
                  "--model", args.model, "--dataset", args.dataset, "--images",
                  str(args.images), "--protocol", "fedavg", "--local-epochs", "1",
                  "--local-batch-size", "0", "--lr", "0.1", "--seed", str(args.seed),
                  "--attack", "inverting-gradients", "-o", f"iterations={args.iterations}",
                  "-o", f"restarts={args.restarts}", "--out", str(out), *extra], out.parent)
    return wall, json.loads((out / "metrics.json").read_text())


def line(name: str, wall: float, metrics: dict[str, Any]) -> str:
    s = metrics["summary"]
    text = (f"  {name:<44}: mean PSNR {s['mean_psnr']:6.2f} dB, SSIM {s['mean_ssim']:.3f} "
            f"over {s['images']} images ({wall:.0f} s)")
    for entry in metrics["rounds"]:
        aggregate = entry.get("aggregate")
        if aggregate:
            text += (f"\n  {'':<44}  server view: {entry['server_view']}; quantisation bound "
                     f"{aggregate['quantization_error_bound']:.2g} per entry; per-node PSNR "
                     + ", ".join(f"{n['mean_psnr']:.2f}" for n in aggregate["nodes"])
                     + f"; matching: {aggregate['matching']}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--model", default="mlp:width=32,depth=1")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = [("every node alone (no SecAgg+)", simulate(args, root / "plain")),
                (f"SecAgg+ aggregate, max weight {args.images}",
                 simulate(args, root / "secagg", "--secagg-plus")),
                ("SecAgg+ aggregate, max weight 1000 (Flower's)",
                 simulate(args, root / "coarse", "--secagg-plus", "--secagg-max-weight",
                          "1000"))]
    print(f"{args.dataset}, model {args.model} (model seed 0), {args.nodes} nodes x "
          f"{args.images} image(s), FedAvg 1 local step at lr 0.1, inverting-gradients "
          f"{args.iterations} iterations x {args.restarts} restart(s), attack seed {args.seed}, "
          f"1 torch thread, load {os.getloadavg()[0]:.1f}")
    for name, (wall, metrics) in runs:
        print(line(name, wall, metrics))


if __name__ == "__main__":
    main()
