"""Flower's quickstart-pytorch audited at its own sizes: leakage against the order-knowing
attack, and the round's time with and without the audit.

examples/flower_quickstart is Flower's example (its ``Net``; SGD momentum 0.9 over shuffled
batches of ``--batch-size``, one local epoch) wrapped for an audit as docs/flower.md tells a
user to; ``--images`` photos per node (random crops of the bundled photographs beyond the 16
bundled photos). Everything runs in this process except the audit's worker (a niced process,
as in a deployment): the example's ServerApp over its ClientApp on ``--nodes`` nodes, every
message serialised as Flower does it.

``leakage`` (default): one round. Per node: the audit's PSNR (``fedavg-shuffled``: the order
unknown, modelled) and, on the *same* update, θ and images, the same budget of the order-
knowing attack (``fedavg`` told the node's true shuffled order and labels: what the node's
``DataLoader`` drew, recorded by wrapping its sampler), and a flat grey image's PSNR.

``direct``: the Flower audit of partition 0 beside ``fedleak victim serve --model
pytorchexample.task:Net`` (the same photos as an image folder, ``--normalization 0.5/0.5``)
attacked by ``fedleak attack`` in another process, same attack and iterations.

``order``: the order model alone, in this process (no Flower): the even guess of the batches,
the modelled order and the order-knowing attack on one user's update.

``timing``: ``--rounds`` rounds unaudited, then audited; per round the wall time from the
train messages sent to the replies aggregated (the audit attacks in its worker meanwhile),
and what the audit attacked, with what budget, after the federation.

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_quickstart.py --images 64 --iterations 600
    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_quickstart.py timing --images 600 \\
        --rounds 3 --iterations 20
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

from round_timer import timed_rounds  # bench/, this script's folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower_quickstart"
ORDERS: list[list[int]] = []


class Nodes:
    """A Grid over the example's ClientApp in this process: node i has partition-id i; it
    keeps each node's last train reply."""

    def __init__(self, app: Any, nodes: int, run_config: dict[str, Any]) -> None:
        from flwr.app import Context, RecordDict

        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={
            "partition-id": i, "num-partitions": nodes}, state=RecordDict(),
            run_config=dict(run_config)) for i in range(nodes)}
        self.replies: dict[int, Any] = {}
        self.orders: dict[int, list[int]] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], timeout: float | None = None
                         ) -> list[Any]:
        from flwr.common.serde import message_from_proto, message_to_proto

        out = []
        for message in messages:
            crossed = message_from_proto(message_to_proto(message))
            node = crossed.metadata.dst_node_id
            ORDERS.clear()
            reply = self.app(crossed, self.contexts[node])
            if crossed.metadata.message_type == "train":
                self.replies[node] = reply
                self.orders[node] = list(ORDERS[0]) if ORDERS else []
            out.append(message_from_proto(message_to_proto(reply)))
        return out


def record_sampler_orders() -> None:
    """Wrap torch's RandomSampler so the order a node's DataLoader draws is kept (ORDERS)."""
    from torch.utils.data import RandomSampler

    original = RandomSampler.__iter__

    def recording(self: Any) -> Any:
        order = list(original(self))
        ORDERS.append(order)
        return iter(order)

    RandomSampler.__iter__ = recording  # type: ignore[method-assign]


def example(args: argparse.Namespace, out: Path, *, audit: bool, rounds: int
            ) -> tuple[Nodes, list[float], float]:
    """Run the example's ServerApp; the grid, each round's wall time, and the whole time."""
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample import client_app, server_app

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    config = {"num-server-rounds": rounds, "fraction-evaluate": 0.0, "local-epochs": 1,
              "learning-rate": args.lr, "batch-size": args.batch_size,
              "images-per-node": args.images, "out": str(out), "iterations": args.iterations,
              "overwrite": True, "queue": args.queue}
    grid = Nodes(client_app.app, args.nodes, config)
    if not audit:
        server_app.LeakageAudit = lambda inner, *a, **k: inner  # the unaudited federation
    try:
        import torch

        torch.manual_seed(0)
        with timed_rounds() as times:
            whole = time.perf_counter()
            server_app.main(grid, Context(run_id=1, node_id=0, node_config={},
                                          state=RecordDict(), run_config=config))
            whole = time.perf_counter() - whole
    finally:
        import importlib

        importlib.reload(server_app)
    return grid, times, whole


def leakage(args: argparse.Namespace, out: Path) -> int:
    import torch

    from fedleak.attacks import create_attack
    from fedleak.harness.federated.observe import observation_from_update
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.flower.arrays import tensors
    from fedleak.harness.metrics.image_metrics import score_reconstruction
    from fedleak.harness.zoo.datasets import denormalize

    torch.set_num_threads(1)
    record_sampler_orders()
    grid, times, whole = example(args, out, audit=True, rounds=1)
    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample.task import INFO, Net, load_data

    metrics = json.loads((out / "metrics.json").read_text())
    print(f"quickstart-pytorch Net, {args.nodes} nodes x {args.images} photos, batch "
          f"{args.batch_size}, lr {args.lr}, SGD momentum 0.9, shuffled, 1 epoch; "
          f"{args.iterations} iterations x 1 restart per update, attack seed 0; round "
          f"{times[0]:.2f} s, federation + audit {whole:.1f} s; load {os.getloadavg()[0]:.1f}")
    torch.manual_seed(0)
    theta = Net().state_dict()
    audit, oracle, grey = [], [], []
    for entry in sorted(metrics["rounds"], key=lambda r: r["partition"]):
        partition = entry["partition"]
        node = 100 + partition
        loader, _ = load_data(partition, args.nodes, args.batch_size, args.images)
        images = torch.stack([loader.dataset[i]["img"] for i in range(len(loader.dataset))])
        labels = torch.tensor([loader.dataset[i]["label"] for i in range(len(loader.dataset))])
        truth = images * 0.5 + 0.5
        new = tensors(grid.replies[node].content["arrays"])
        model = Net()
        model.load_state_dict(theta)
        names = [n for n, _ in model.named_parameters()]
        protocol = Protocol("fedavg", 1, args.batch_size, args.lr, momentum=0.9, shuffle=True)
        observation = observation_from_update(
            model, dict(model.named_parameters()), {}, [new[n] - theta[n] for n in names],
            protocol, INFO, num_images=len(labels), labels=labels)
        order = torch.tensor([grid.orders[node]])
        told = observation.simulate.visiting(order)  # type: ignore[union-attr]
        observation.simulate = lambda x, y, told=told: told(x, y)  # a plain, fixed-order replay
        attack = create_attack("fedavg", {"iterations": args.iterations, "labels": "known"})
        known = score_reconstruction(denormalize(attack.reconstruct(observation, seed=0)
                                                 .images, INFO).clamp(0, 1), truth)
        flat = score_reconstruction(torch.full_like(truth, 0.5), truth)
        audit.append(entry["mean_psnr"])
        oracle.append(known.mean_psnr)
        grey.append(flat.mean_psnr)
        print(f"  partition {partition} ({entry['node']}): replay {entry['replay']}, "
              f"{entry['local_steps']} local steps, {entry['iterations']} of "
              f"{int(entry['budget']['iterations_asked'])} iterations: audit (order modelled) "
              f"PSNR {entry['mean_psnr']:.2f} dB, labels {entry['label_accuracy']:.0%}; "
              f"told the true order and labels {known.mean_psnr:.2f} dB; grey image "
              f"{flat.mean_psnr:.2f} dB")
        extras = entry.get("attack_extras") or {}
        print(f"    order: {extras.get('order_history', '')}")
    mean = sum(audit) / len(audit)
    print(f"  mean: audit {mean:.2f} dB, told the order {sum(oracle) / len(oracle):.2f} dB, "
          f"grey {sum(grey) / len(grey):.2f} dB (difference {mean - sum(oracle) / len(oracle):+.2f}"
          " dB)")
    return 0


def timing(args: argparse.Namespace, out: Path) -> int:
    import torch

    torch.set_num_threads(1)
    _, plain, plain_whole = example(args, out.with_name("plain"), audit=False,
                                    rounds=args.rounds)
    _, audited, audited_whole = example(args, out, audit=True, rounds=args.rounds)
    metrics = json.loads((out / "metrics.json").read_text())
    print(f"quickstart-pytorch Net, {args.nodes} nodes x {args.images} photos, batch "
          f"{args.batch_size}, {args.rounds} rounds, 1 torch thread, audit worker niced +10; "
          f"load {os.getloadavg()[0]:.1f}")
    for r, (a, b) in enumerate(zip(plain, audited, strict=True), start=1):
        print(f"  round {r}: unaudited {a:.2f} s, audited {b:.2f} s ({b / a:.2f} x)")
    print(f"  all rounds: unaudited {sum(plain):.2f} s, audited {sum(audited):.2f} s "
          f"({sum(audited) / sum(plain):.2f} x); the audit finished "
          f"{audited_whole - sum(audited):.1f} s after the last round (whole run "
          f"{audited_whole:.1f} s, unaudited {plain_whole:.1f} s)")
    attacked = metrics["rounds"]
    images = sum(r["num_images"] for r in attacked)
    print(f"  attacked {len(attacked)} update(s), {images} images, each "
          f"{args.iterations} iterations x 1 restart asked, "
          f"{[r['iterations'] for r in attacked]} run; skipped or not attacked: "
          f"{sum('not attacked' in w for w in metrics['warnings'])}; "
          f"mean PSNR {metrics['summary']['mean_psnr']}")
    return 0


def direct(args: argparse.Namespace, out: Path) -> int:
    """The Flower audit beside the direct two-process attack on the same Net and images: node
    partition 0's photos written as an image folder, served by ``fedleak victim serve --model
    pytorchexample.task:Net`` (θ from seed 0, as the ServerApp's), attacked by ``fedleak
    attack --model-factory`` with the same attack and iterations."""
    import subprocess

    import numpy as np
    import torch
    from PIL import Image

    torch.set_num_threads(1)
    _, times, _ = example(args, out, audit=True, rounds=1)
    metrics = json.loads((out / "metrics.json").read_text())
    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample.task import load_data

    entry = next(r for r in metrics["rounds"] if r["partition"] == 0)
    loader, _ = load_data(0, args.nodes, args.batch_size, args.images)
    folder = out.parent / "partition-0"
    for i in range(len(loader.dataset)):
        pixels = loader.dataset.arrays[i]  # the uint8 HWC array the node's ToTensor reads
        label = loader.dataset.labels[i]
        (folder / f"class-{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.asarray(pixels)).save(folder / f"class-{label}" / f"{i:04d}.png")
    classes = sorted(p.name for p in folder.iterdir())
    if len(classes) < 10:  # Net has ten outputs: the folder needs ten classes
        for c in range(10):
            (folder / f"class-{c}").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
           "OMP_NUM_THREADS": "1"}
    fedleak = [sys.executable, "-m", "fedleak"]
    victim = subprocess.Popen(
        [*fedleak, "victim", "serve", "--dataset", "imagefolder", "--data-root", str(folder),
         "--split", "all", "--normalization", "0.5/0.5", "--model", "pytorchexample.task:Net",
         "--batch-size", str(args.images), "--protocol", "fedavg", "--local-batch-size",
         str(args.batch_size), "--lr", str(args.lr), "--momentum", "0.9", "--shuffle-batches",
         "--seed", "0", "--port", "0"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        address = ""
        assert victim.stdout is not None
        for line in victim.stdout:
            if "127.0.0.1:" in line:
                address = next(w for w in line.split() if ":" in w and w[-1].isdigit())
                break
        if not address:
            print("the victim did not start")
            return 1
        attack_out = out.parent / "direct"
        done = subprocess.run(
            [*fedleak, "attack", "--victim", address, "--attack", "fedavg-shuffled",
             "--iterations", str(args.iterations), "--restarts", "1", "--quiet",
             "--model-factory", "pytorchexample.task:Net", "--out", str(attack_out)],
            env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
    finally:
        victim.terminate()
        victim.wait(timeout=30)
    direct_run = json.loads((attack_out / "metrics.json").read_text())
    other = direct_run["rounds"][0]
    print(f"quickstart Net, partition 0's {args.images} photos, batch {args.batch_size}, "
          f"momentum 0.9, shuffled; fedavg-shuffled, {args.iterations} iterations, seed 0; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  Flower audit (flwr ServerApp/ClientApp, the node's own loop): PSNR "
          f"{entry['mean_psnr']:.2f} dB, labels {entry['label_accuracy']:.0%}, replay "
          f"{entry['replay']}")
    print(f"  fedleak victim serve --model pytorchexample.task:Net + fedleak attack: PSNR "
          f"{other['mean_psnr']:.2f} dB, labels {other['label_accuracy']:.0%}, replay "
          f"{other['replay']} (difference {entry['mean_psnr'] - other['mean_psnr']:+.2f} dB)")
    return 0


def order(args: argparse.Namespace, out: Path) -> int:
    """The order model alone, in-process (no Flower): one user of ``--images`` photo crops in
    shuffled batches of ``--batch-size`` (momentum 0.9, fedleak's victim code, a seeded secret
    order), attacked by ``fedavg-shuffled`` with the even guess of the batches
    (``revisions=0``) and with the order modelled, each with recovered and with true labels,
    beside ``fedavg`` told the true order and labels; same iterations and seed."""
    import dataclasses

    import torch

    from fedleak.attacks import create_attack
    from fedleak.harness.federated.local_update import draw_order
    from fedleak.harness.federated.observe import observe
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.metrics.image_metrics import score_reconstruction
    from fedleak.harness.zoo.bundled_images import photo_crops
    from fedleak.harness.zoo.datasets import denormalize

    torch.set_num_threads(1)
    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample.task import INFO, Net

    images, labels = photo_crops(args.images, seed=11)
    torch.manual_seed(0)
    protocol = Protocol("fedavg", 1, args.batch_size, args.lr, momentum=0.9, shuffle=True)
    observation = observe(Net(), images, labels, INFO, protocol,
                          generator=torch.Generator().manual_seed(2))
    secret = draw_order(protocol, args.images, torch.Generator().manual_seed(2))

    def psnr(attack: str, target: Any, **options: Any) -> float:
        result = create_attack(attack, {"iterations": args.iterations, **options}).reconstruct(
            target, seed=0)
        return score_reconstruction(denormalize(result.images, INFO).clamp(0, 1),
                                    images).mean_psnr

    known = dataclasses.replace(observation, labels=labels)
    told = observation.simulate.visiting(secret)  # type: ignore[union-attr]
    oracle = dataclasses.replace(known, simulate=lambda x, y: told(x, y))
    print(f"quickstart Net, {args.images} photo crops in shuffled batches of {args.batch_size}, "
          f"momentum 0.9; {args.iterations} iterations, seed 0; load {os.getloadavg()[0]:.1f}")
    for name, target, source in (("recovered", observation, "recover"),
                                 ("true", known, "known")):
        guess = psnr("fedavg-shuffled", target, revisions=0, labels=source)
        modelled = psnr("fedavg-shuffled", target, labels=source)
        print(f"  {name} labels: even guess of the batches {guess:.2f} dB, order modelled "
              f"{modelled:.2f} dB")
    print(f"  told the true order and labels: {psnr('fedavg', oracle, labels='known'):.2f} dB; "
          f"grey image "
          f"{score_reconstruction(torch.full_like(images, 0.5), images).mean_psnr:.2f} dB")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="leakage",
                        choices=("leakage", "timing", "direct", "order"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--images", type=int, default=64, help="photos per node")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3, help="timing: rounds")
    parser.add_argument("--queue", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="fedleak-quickstart-")) / "audit").resolve()
    modes = {"leakage": leakage, "timing": timing, "direct": direct, "order": order}
    return modes[args.mode](args, out)


if __name__ == "__main__":
    sys.exit(main())
