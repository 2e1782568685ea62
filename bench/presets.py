"""The optimisation presets side by side at one budget, on the same observations and seeds.

Each row is one preset (or a composition given with ``--extra NAME:ATTACK:k=v,k=v``) attacking
one bundled photo (32×32, FedSGD unless ``--batchnorm``) with a budget of ``--budget`` objective
evaluations per image: first-order presets take ``budget / restarts`` steps per restart; DLG's
L-BFGS takes ``budget / inner_iterations`` steps (each up to ``inner_iterations`` evaluations).
Prints one JSON line per attack and a table of mean PSNR (dB), label accuracy and wall time,
beside a flat grey image's PSNR.

- default: lenet-zhu untrained (model seed 0), no BatchNorm; gradinversion runs with ``bn=0``.
- ``--batchnorm``: ConvNet width 16 (untrained, model seed 0) with training-mode BatchNorm,
  FedAvg (one epoch, batch 1, τ = 0.01: one local step), the user returning its buffers, so
  the BatchNorm prior pulls towards the batch statistics inferred from them.

    OMP_NUM_THREADS=1 python bench/presets.py [--photos 0-1] [--budget 1200]
    OMP_NUM_THREADS=1 python bench/presets.py --batchnorm
"""

from __future__ import annotations

import json
import statistics
import time

import click
import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import psnr_per_image
from fedleak.harness.victim.selection import parse_indices
from fedleak.harness.zoo.datasets import denormalize, load_dataset
from fedleak.harness.zoo.models import build_model


def presets(budget: int, batchnorm: bool) -> dict[str, tuple[str, dict[str, object]]]:
    """Row name → (attack, options) at ``budget`` evaluations per image."""
    rows: dict[str, tuple[str, dict[str, object]]] = {
        "inverting-gradients": ("inverting-gradients", {"iterations": budget}),
        "dlg": ("dlg", {"iterations": max(1, budget // 20)}),
        "qian": ("qian", {"iterations": budget}),
        "gradinversion": ("gradinversion", {"iterations": max(1, budget // 4), "restarts": 4,
                                            **({} if batchnorm else {"bn": 0.0})}),
    }
    if batchnorm:
        rows["inverting-gradients + bn"] = ("inverting-gradients",
                                            {"iterations": budget, "bn": 0.1})
    return rows


def observation_for(index: int, batchnorm: bool):  # noqa: ANN201 - bench helper
    data = load_dataset("photos", "all")
    info, image, label = data.info, data.images[index:index + 1], data.labels[index:index + 1]
    torch.manual_seed(0)
    if batchnorm:
        model = build_model("convnet:width=16", info.shape, info.num_classes)
        protocol = Protocol(kind="fedavg", local_epochs=1, batch_size=1, learning_rate=0.01)
        return info, image, label, observe(model, image, label, info, protocol,
                                           return_buffers=True)
    model = build_model("lenet-zhu", info.shape, info.num_classes)
    return info, image, label, observe(model, image, label, info)


def parse_extra(spec: str) -> tuple[str, str, dict[str, object]]:
    """``NAME:ATTACK:k=v,k=v`` → (name, attack, options)."""
    name, attack, *rest = spec.split(":", 2)
    options: dict[str, object] = {}
    for item in filter(None, (rest[0] if rest else "").split(",")):
        key, _, value = item.partition("=")
        options[key] = value
    return name, attack, options


@click.command()
@click.option("--photos", default="0-1", show_default=True)
@click.option("--budget", default=1200, show_default=True,
              help="Objective evaluations per image (restarts x steps; L-BFGS: steps x 20).")
@click.option("--batchnorm", is_flag=True, help="ConvNet-16, training-mode BN, FedAvg + buffers.")
@click.option("--only", default="", help="Comma-separated subset of the rows.")
@click.option("--extra", multiple=True, help="Another row: NAME:ATTACK:k=v,k=v (repeatable).")
def main(photos: str, budget: int, batchnorm: bool, only: str, extra: tuple[str, ...]) -> None:
    torch.set_num_threads(1)
    rows = presets(budget, batchnorm)
    for spec in extra:
        name, attack, options = parse_extra(spec)
        rows[name] = (attack, options)
    chosen = [r for r in rows if not only or r in only.split(",")]
    table: dict[str, list[dict[str, object]]] = {r: [] for r in chosen}
    greys = []
    for index in parse_indices(photos, 20):
        info, image, label, observation = observation_for(index, batchnorm)
        greys.append(float(psnr_per_image(torch.full_like(image, 0.5), image)))
        for row in chosen:
            attack, options = rows[row]
            started = time.perf_counter()
            result = create_attack(attack, options).reconstruct(observation, seed=0)
            out = denormalize(result.images, info).clamp(0, 1)
            record = {"row": row, "photo": index, "attack": attack,
                      "psnr": round(float(psnr_per_image(out, image)), 3),
                      "label_ok": result.labels.tolist() == label.tolist(),
                      "objective": result.extras.get("objective"),
                      "optimizer": result.extras.get("optimizer"),
                      "priors": result.extras.get("priors"),
                      "wall_s": round(time.perf_counter() - started, 1)}
            table[row].append(record)
            print(json.dumps(record), flush=True)
    model = "convnet:width=16 train-mode BN, FedAvg + buffers" if batchnorm else "lenet-zhu"
    print(f"\n{model}, photos {photos}, budget {budget} evaluations per image, attack seed 0")
    print(f"{'row':28} {'PSNR dB':>8} {'labels':>7} {'wall s':>7}")
    for row in chosen:
        records = table[row]
        mean = statistics.mean(float(str(r["psnr"])) for r in records)
        labels = sum(bool(r["label_ok"]) for r in records) / len(records)
        wall = statistics.mean(float(str(r["wall_s"])) for r in records)
        print(f"{row:28} {mean:8.2f} {labels:7.2f} {wall:7.1f}")
    print(f"{'grey image':28} {statistics.mean(greys):8.2f}")


if __name__ == "__main__":
    main()
