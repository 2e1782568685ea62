"""Inverting Gradients on the bundled photos in the paper's setting, one photo at a time.

lenet-zhu untrained (model seed 0), one 32×32 photo per attack, 4800 iterations, tv 1e-2,
lr 0.1, one restart (attack seed 0); prints one JSON line per photo (PSNR, SSIM, label, wall
time) and the mean PSNR. The observation is built as the harness builds it (the victim's
``local_update``, the attacker's ``UpdateSimulator``). The same measurement across two
processes: ``fedleak victim serve --dataset photos --split all --model lenet-zhu --seed 0`` and
``fedleak attack --victim HOST:PORT --rounds 20 --iterations 4800``.

    .venv/bin/python bench/attack_quality.py [--photos 0-19] [--iterations 4800] [--tv 0.01]
"""

from __future__ import annotations

import json
import statistics
import time

import click
import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.metrics.image_metrics import psnr_per_image, ssim_per_image
from fedleak.harness.victim.selection import parse_indices
from fedleak.harness.zoo.datasets import denormalize, load_dataset
from fedleak.harness.zoo.models import build_model


def attack_photo(index: int, options: dict, model_seed: int = 0, attack_seed: int = 0) -> dict:
    data = load_dataset("photos", "all")
    info, image, label = data.info, data.images[index:index + 1], data.labels[index:index + 1]
    torch.manual_seed(model_seed)
    model = build_model("lenet-zhu", info.shape, info.num_classes)
    observation = observe(model, image, label, info)
    started = time.perf_counter()
    result = create_attack("inverting-gradients", options).reconstruct(observation,
                                                                      seed=attack_seed)
    wall = time.perf_counter() - started
    out = denormalize(result.images, info).clamp(0, 1)
    return {"index": index, "photo": info.class_names[int(label)],
            "label_ok": result.labels.tolist() == label.tolist(),
            "psnr": float(psnr_per_image(out, image)), "ssim": float(ssim_per_image(out, image)),
            "wall_s": wall}


@click.command()
@click.option("--photos", default="0-19", show_default=True)
@click.option("--iterations", default=4800, show_default=True)
@click.option("--tv", default=1e-2, show_default=True)
@click.option("--threads", default=1, show_default=True)
def main(photos: str, iterations: int, tv: float, threads: int) -> None:
    torch.set_num_threads(threads)
    psnrs = []
    for index in parse_indices(photos, 20):
        row = attack_photo(index, {"iterations": iterations, "tv": tv})
        psnrs.append(row["psnr"])
        print(json.dumps(row), flush=True)
    print(f"mean PSNR {statistics.mean(psnrs):.2f} dB over {len(psnrs)} photo(s)")


if __name__ == "__main__":
    main()
