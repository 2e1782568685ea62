"""The malicious server's probe of a Flower deployment: what it reads beside the honest audit.

Everything runs in this process over Flower's own messages (every message serialised as
Flower does it between processes; SecAgg+ through Flower's own workflow and mod), the audit
attacking in the round (``--inline``), one torch thread:

- ``mlp`` (default): fedleak's Flower app, ``mlp:width=1000,depth=1`` on digits (its first
  layer linear over the input, then ReLU), ``--nodes`` nodes of ``--images`` images, FedAvg
  with one local step at τ = 0.1, one round; then ``probe=trap-weights``. Per node: images at
  >= 20 dB and >= 5 dB above their floor (of ``--images``), exact recoveries, mean PSNR beside
  the floor, and the honest audit's figure on the same nodes;
- ``secagg``: the same federation under Flower's SecAgg+ (max weight = the nodes' n): the
  probe attacks the aggregate of the nodes' masked updates; beside it the per-node probe of
  the same federation without SecAgg+ — the difference is what SecAgg+ buys back;
- ``vet``: the same federation with ``vet`` on every node: what vet buys back;
- ``quickstart``: examples/flower_quickstart (Flower's quickstart-pytorch ``Net``,
  convolutions first, shuffled batches of 32 with momentum) at ``--images`` photos per node
  with ``probe = "trap-weights fishing"``: its figure beside the floor, or why it cannot.

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_probe.py [mlp|secagg|vet|quickstart|all]
        [--nodes 2] [--images 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mlp:width=1000,depth=1"


class Wire:
    """A Grid over a ClientApp in this process, every message serialised as between
    processes; node i has partition-id i."""

    def __init__(self, app: Any, nodes: int, run_config: dict[str, Any] | None = None) -> None:
        from flwr.app import Context, RecordDict

        self.app = app
        self.run = type("Run", (), {"run_id": 1})()
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={
            "partition-id": i, "num-partitions": nodes}, state=RecordDict(),
            run_config=dict(run_config or {})) for i in range(nodes)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], timeout: float | None = None
                         ) -> list[Any]:
        from flwr.common.serde import message_from_proto, message_to_proto

        crossed = [message_from_proto(message_to_proto(m)) for m in messages]
        return [message_from_proto(message_to_proto(
            self.app(m, self.contexts[m.metadata.dst_node_id]))) for m in crossed]


def federation(args: argparse.Namespace, out: Path, **changes: Any) -> dict[str, Any]:
    """fedleak's Flower app over :class:`Wire`, audited with the probe; its metrics.json."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedleak.harness.flower.federation import FederationSettings, make_client_app, run_server

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    s = FederationSettings(**{"nodes": args.nodes, "rounds": 1, "dataset": "digits",
                              "model": MODEL, "images": args.images, "protocol": "fedavg",
                              "lr": 0.1, "options": (f"iterations={args.iterations}",
                                                     "restarts=1"),
                              "inline": True, "probe": ("trap-weights",), "out": str(out),
                              "overwrite": True, **changes})
    run_server(Wire(make_client_app(s), s.nodes), s)  # type: ignore[arg-type]
    return json.loads((out / "metrics.json").read_text())


def outcome_line(o: dict[str, Any]) -> str:
    r = o.get("round") or {}
    if o["status"] != "attacked" or r.get("mean_psnr") is None:
        why = o.get("reason") or r.get("unscored")
        return f"{o['attack']} on {o['node']}: {o['status']}: {why}"
    floor = (r.get("floors") or {}).get("mean_psnr")
    return (f"{o['attack']} on {o['node']}: {o['recovered']} of {o['images']} at >= 20 dB and "
            f">= 5 dB above their floor, {r.get('exact')} exact (>= 40 dB); mean PSNR "
            f"{r['mean_psnr']:.2f} dB, floor {floor:.2f} dB")


def honest_line(metrics: dict[str, Any]) -> str:
    s = metrics["summary"]
    floors = s.get("floors") or {}
    attack = metrics["settings"]["attack"]
    iterations = metrics["settings"]["options"].get("iterations")
    return (f"honest audit of the same round ({attack}, {iterations} iterations): mean PSNR "
            f"{s['mean_psnr']:.2f} dB, floor {floors.get('mean_psnr', float('nan')):.2f} dB, "
            f"{floors.get('above')} of {s['images']} image(s) above it")


def mlp(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    metrics = federation(args, out / "mlp")
    print(f"  {honest_line(metrics)}")
    for o in metrics["malicious_probe"]["outcomes"]:
        print(f"  probe: {outcome_line(o)}")
    return metrics["malicious_probe"]["outcomes"]


def secagg(args: argparse.Namespace, out: Path) -> None:
    alone = mlp(args, out)
    metrics = federation(args, out / "secagg", secagg_plus=True)
    (o,) = metrics["malicious_probe"]["outcomes"]
    print(f"  under SecAgg+ (max weight {args.images}): probe: {outcome_line(o)}")
    per_node = sum(x.get("recovered") or 0 for x in alone)
    total = sum(x.get("images") or 0 for x in alone)
    print(f"  what SecAgg+ buys back against this probe: {per_node} of {total} images read "
          f"from the nodes' own updates, {o.get('recovered')} of {o.get('images')} from their "
          f"aggregate ({per_node - (o.get('recovered') or 0):+d} images kept private)")


def vet(args: argparse.Namespace, out: Path) -> None:
    metrics = federation(args, out / "vet", defenses=("vet",))
    print(f"  {honest_line(metrics)} (vet on every node passed the honest θ)")
    for o in metrics["malicious_probe"]["outcomes"]:
        print(f"  probe with vet on the nodes: {outcome_line(o)}")


def quickstart(args: argparse.Namespace, out: Path) -> None:
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    sys.path.insert(0, str(ROOT / "examples" / "flower_quickstart"))
    from pytorchexample import client_app, server_app

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    config = {"num-server-rounds": 1, "fraction-evaluate": 0.0, "local-epochs": 1,
              "learning-rate": 0.1, "batch-size": 32, "images-per-node": args.images,
              "out": str(out / "quickstart"), "iterations": args.iterations, "overwrite": True,
              "queue": 8, "probe": "trap-weights fishing"}
    import torch

    torch.manual_seed(0)
    server_app.main(Wire(client_app.app, args.nodes, config),  # type: ignore[arg-type]
                    Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                            run_config=config))
    metrics = json.loads((out / "quickstart" / "metrics.json").read_text())
    print(f"  {honest_line(metrics)}")
    for o in metrics["malicious_probe"]["outcomes"]:
        print(f"  probe: {outcome_line(o)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="mlp",
                        choices=["mlp", "secagg", "vet", "quickstart", "all"])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--images", type=int, default=64, help="images per node")
    parser.add_argument("--iterations", type=int, default=20,
                        help="the honest audit's iterations (the probe's attacks are exact)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    started, load = time.perf_counter(), os.getloadavg()[0]
    print(f"{args.nodes} nodes x {args.images} images, one round, then the probe; model and "
          f"attack seed 0; load {load:.1f}")
    with tempfile.TemporaryDirectory() as temp:
        for what in (["mlp", "secagg", "vet", "quickstart"] if args.what == "all"
                     else [args.what]):
            print(f"{what}:")
            {"mlp": mlp, "secagg": secagg, "vet": vet, "quickstart": quickstart}[what](
                args, Path(temp))
    print(f"({time.perf_counter() - started:.0f} s; load {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
