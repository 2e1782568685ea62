"""Flower's quickstart-pytorch audited: its figure beside a fedleak victim's, and the budget.

examples/flower_quickstart is Flower's example (its ``Net``; SGD momentum 0.9 over shuffled
batches of ``--batch-size``, one local epoch; bundled photos standing in for CIFAR-10) wrapped
for an audit as docs/flower.md tells a user to. Two measurements:

default: the example's ServerApp and ClientApp in this process (every message serialised as
Flower does it), ``--nodes`` 2 nodes × ``--images`` photos, ``--iterations`` of Inverting
Gradients (``--budget``: unbounded by default here), attack seed 0, θ = ``Net()`` after
``torch.manual_seed(0)``. Beside each node's figure: the same attack (same iterations and
seed) on the update fedleak's victim code computes (``observe``) for the same θ, photos and
procedure — an undefended fedleak victim on the same images. With ``--batch-size`` below the
images per node the nodes take several shuffled momentum steps: the round is labelled inexact.

``--deploy``: the example on a real SuperLink and SuperNodes (examples/flower_deploy.py),
asking for ``--iterations`` (make it large to see the bound bite): per round, the round's
wall time as the audit measured it, the seconds each node's attack was allowed (default budget:
3 × the round, at least 10 s, shared by the nodes), the iterations it ran and its wall time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_quickstart.py [--images 2] [--iterations 2400]
    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_quickstart.py --deploy --images 8 \\
        --iterations 100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower_quickstart"


class Nodes:
    """A Grid over the example's ClientApp in this process: node i has partition-id i."""

    def __init__(self, app: Any, nodes: int, run_config: dict[str, Any]) -> None:
        from flwr.app import Context, RecordDict

        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={
            "partition-id": i, "num-partitions": nodes}, state=RecordDict(),
            run_config=dict(run_config)) for i in range(nodes)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], timeout: float | None = None
                         ) -> list[Any]:
        from flwr.common.serde import message_from_proto, message_to_proto

        out = []
        for message in messages:
            crossed = message_from_proto(message_to_proto(message))
            reply = self.app(crossed, self.contexts[crossed.metadata.dst_node_id])
            out.append(message_from_proto(message_to_proto(reply)))
        return out


def in_process(args: argparse.Namespace, out: Path) -> int:
    import torch
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedleak.attacks import create_attack
    from fedleak.harness.federated.observe import observe
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.metrics.image_metrics import score_reconstruction
    from fedleak.harness.zoo.datasets import denormalize, load_dataset

    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample import client_app, server_app
    from pytorchexample.task import INFO, Net

    torch.set_num_threads(1)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    config = {"num-server-rounds": 1, "fraction-evaluate": 0.0, "local-epochs": 1,
              "learning-rate": args.lr, "batch-size": args.batch_size,
              "images-per-node": args.images, "out": str(out), "iterations": args.iterations,
              "overwrite": True, "budget": args.budget}
    torch.manual_seed(0)
    started = time.perf_counter()
    server_app.main(Nodes(client_app.app, args.nodes, config),
                    Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                            run_config=config))
    wall = time.perf_counter() - started
    metrics = json.loads((out / "metrics.json").read_text())
    photos = load_dataset("photos", "train")
    torch.manual_seed(0)
    theta = Net().state_dict()
    print(f"quickstart-pytorch Net, {args.nodes} nodes x {args.images} photos, batch "
          f"{args.batch_size}, lr {args.lr}, SGD momentum 0.9, shuffled, 1 epoch; "
          f"inverting-gradients, attack seed 0; federation + audit {wall:.1f} s")
    for entry in sorted(metrics["rounds"], key=lambda r: r["round_id"]):
        partition = int(entry["round_id"].split("-")[-1]) - 1
        chosen = torch.arange(partition, len(photos), args.nodes)[:args.images]
        model = Net()
        model.load_state_dict(theta)
        protocol = Protocol("fedavg", 1, args.batch_size, args.lr, momentum=0.9, shuffle=True)
        observation = observe(model, photos.images[chosen], photos.labels[chosen], INFO,
                              protocol)
        attack = create_attack("inverting-gradients", {"iterations": entry["iterations"]})
        victim = score_reconstruction(
            denormalize(attack.reconstruct(observation, seed=0).images, INFO).clamp(0, 1),
            photos.images[chosen])
        budget = entry.get("budget")
        allowed = f"{budget['allowed_s']:.1f} s allowed" if budget else "unbounded"
        print(f"  {entry['round_id']}: replay {entry['replay']}, {entry['local_steps']} local "
              f"step(s), {entry['iterations']} iterations ({allowed}): audit PSNR "
              f"{entry['mean_psnr']:.2f} dB, SSIM "
              f"{entry['mean_ssim']:.3f}, labels {entry['label_accuracy']:.0%}; fedleak victim "
              f"on the same photos {victim.mean_psnr:.2f} dB, SSIM {victim.mean_ssim:.3f}")
        for reason in entry.get("inexact_reasons", []):
            print(f"    inexact: {reason}")
    summary = metrics["summary"]
    if summary.get("mean_psnr") is not None:
        print(f"  headline (exact rounds): mean PSNR {summary['mean_psnr']:.2f} dB")
    if "inexact_summary" in metrics:
        print(f"  LOWER BOUND ONLY (inexact rounds): mean PSNR "
              f"{metrics['inexact_summary']['mean_psnr']:.2f} dB")
    return 0


def deploy(args: argparse.Namespace, out: Path) -> int:
    run_config = (f'out="{out}" iterations={args.iterations} images-per-node={args.images} '
                  f'batch-size={args.batch_size} learning-rate={args.lr} overwrite=true '
                  f'budget={args.budget or 3.0}')
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "flower_deploy.py"),
                           str(EXAMPLE), "--nodes", str(args.nodes), "--run-config", run_config],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        return 1
    metrics = json.loads((out / "metrics.json").read_text())
    print(f"flwr run of the quickstart, {args.nodes} SuperNodes x {args.images} photos, "
          f"{args.iterations} iterations asked: {wall:.0f} s in all")
    for entry in sorted(metrics["rounds"], key=lambda r: r["round_id"]):
        budget = entry.get("budget") or {}
        print(f"  {entry['round_id']}: round {budget.get('round_s', 0):.1f} s, allowed "
              f"{budget.get('allowed_s', 0):.1f} s, ran {entry['iterations']} iterations in "
              f"{entry['wall_time_s']:.1f} s; PSNR {entry['mean_psnr']:.2f} dB "
              f"({entry['replay']})")
    attack = sum(r["wall_time_s"] for r in metrics["rounds"])
    round_s = max((r.get("budget") or {}).get("round_s", 0) for r in metrics["rounds"])
    print(f"  attacks {attack:.1f} s for a round of {round_s:.1f} s: "
          f"{attack / max(round_s, 1e-9):.1f} x the round")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", action="store_true")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--images", type=int, default=2, help="photos per node (<= 8 for 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=2400)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", type=float, default=0.0,
                        help="the audit's budget (x the round; 0: unbounded, the default here "
                             "in-process, where a round takes milliseconds; --deploy: 3)")
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="fedleak-quickstart-")) / "audit").resolve()
    return deploy(args, out) if args.deploy else in_process(args, out)


if __name__ == "__main__":
    sys.exit(main())
