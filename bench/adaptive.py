"""Plain vs defense-aware Inverting Gradients at equal budget, same seeds (issue 19).

For each defense setting and each photo, the same observation (lenet-zhu untrained, model seed
0, one 32×32 bundled photo per round, FedSGD, defense randomness seeded) is attacked twice with
the same iterations, tv and attack seed: ``plain`` (``objective=cosine``, ``replay=plain``: the
non-adaptive attack of the README's table) and ``aware`` (``objective=auto``, ``replay=auto``:
the parts chosen from the published defense chain, :mod:`fedleak.attacks.adaptive`). Prints one
JSON line per attack and a table of mean PSNR (dB) per setting, with the gain.

``--batchnorm`` measures the BatchNorm-statistics prior instead: the ConvNet of Inverting
Gradients at width 16 (untrained, model seed 0) with training-mode BatchNorm, FedAvg (one
epoch, batch 1, τ = 0.01, so one local step), one photo per round, the user returning its
buffers: ``plain`` (bn = 0) against ``aware`` (bn = ``--bn-weight``, batch statistics inferred
from the returned buffers), and a flat grey image's PSNR for scale.

    OMP_NUM_THREADS=1 python bench/adaptive.py [--photos 0-1] [--iterations 1200]
    OMP_NUM_THREADS=1 python bench/adaptive.py --batchnorm [--bn-weight 0.01] [--photos 0-1]
"""

from __future__ import annotations

import json
import statistics
import time

import click
import torch

from fedleak.attacks import create_attack
from fedleak.defenses import build_chain
from fedleak.harness.shared.datasets import denormalize, load_dataset
from fedleak.harness.shared.metrics import psnr_per_image
from fedleak.harness.shared.models import build_model
from fedleak.harness.shared.observation import observe
from fedleak.harness.shared.protocol import Protocol
from fedleak.harness.shared.selection import parse_indices

SETTINGS: dict[str, list[tuple[str, dict[str, object]]]] = {
    "prune p=0.9": [("prune", {"p": 0.9})],
    "prune p=0.99": [("prune", {"p": 0.99})],
    "dpsgd sigma=0.01 C=1": [("dpsgd", {"noise-multiplier": 0.01, "max-grad-norm": 1.0})],
    "quantize 4 bits": [("quantize", {"bits": 4})],
}
VARIANTS = {"plain": {"objective": "cosine", "replay": "plain"},
            "aware": {"objective": "auto", "replay": "auto"}}


def attack_once(setting: str, index: int, variant: str, iterations: int, tv: float,
                model_name: str) -> dict[str, object]:
    """One attack on photo ``index`` under ``setting`` with the ``variant``'s parts."""
    data = load_dataset("photos", "all")
    info, image, label = data.info, data.images[index:index + 1], data.labels[index:index + 1]
    torch.manual_seed(0)
    model = build_model(model_name, info.shape, info.num_classes)
    chain = build_chain(SETTINGS[setting])
    observation = observe(model, image, label, info, defenses=chain,
                          generator=torch.Generator().manual_seed(1000 + index))
    attack = create_attack("inverting-gradients",
                           {"iterations": iterations, "tv": tv, **VARIANTS[variant]})
    started = time.perf_counter()
    result = attack.reconstruct(observation, seed=0)
    out = denormalize(result.images, info).clamp(0, 1)
    return {"setting": setting, "photo": index, "variant": variant,
            "objective": result.extras["objective"], "replay": result.extras["replay"],
            "psnr": round(float(psnr_per_image(out, image)), 3),
            "label_ok": result.labels.tolist() == label.tolist(),
            "wall_s": round(time.perf_counter() - started, 1)}


def batchnorm_once(index: int, variant: str, iterations: int, tv: float, weight: float
                   ) -> dict[str, object]:
    """One attack on photo ``index``: ConvNet width 16, training-mode BN, FedAvg, buffers."""
    data = load_dataset("photos", "all")
    info, image, label = data.info, data.images[index:index + 1], data.labels[index:index + 1]
    torch.manual_seed(0)
    model = build_model("convnet:width=16", info.shape, info.num_classes)
    protocol = Protocol(kind="fedavg", local_epochs=1, batch_size=1, learning_rate=0.01)
    observation = observe(model, image, label, info, protocol, return_buffers=True)
    options = {"iterations": iterations, "tv": tv, "bn": weight if variant == "aware" else 0.0}
    started = time.perf_counter()
    result = create_attack("fedavg", options).reconstruct(observation, seed=0)
    out = denormalize(result.images, info).clamp(0, 1)
    grey = torch.full_like(image, 0.5)
    return {"setting": "convnet BN fedavg buffers", "photo": index, "variant": variant,
            "bn": options["bn"], "bn_source": result.extras.get("bn_source"),
            "psnr": round(float(psnr_per_image(out, image)), 3),
            "grey_psnr": round(float(psnr_per_image(grey, image)), 3),
            "label_ok": result.labels.tolist() == label.tolist(),
            "wall_s": round(time.perf_counter() - started, 1)}


@click.command()
@click.option("--photos", default="0-1", show_default=True)
@click.option("--iterations", default=1200, show_default=True)
@click.option("--tv", default=1e-2, show_default=True)
@click.option("--model", "model_name", default="lenet-zhu", show_default=True)
@click.option("--settings", "only", default="", help="Comma-separated subset of the settings.")
@click.option("--batchnorm", is_flag=True, help="Measure the BatchNorm prior (see above).")
@click.option("--bn-weight", default=0.01, show_default=True)
@click.option("--variants", default="plain,aware", show_default=True,
              help="With --batchnorm: which of plain, aware to run.")
def main(photos: str, iterations: int, tv: float, model_name: str, only: str,
         batchnorm: bool, bn_weight: float, variants: str) -> None:
    torch.set_num_threads(1)
    if batchnorm:
        rows = []
        for i in parse_indices(photos, 20):
            for v in variants.split(","):
                rows.append(batchnorm_once(i, v, iterations, tv, bn_weight))
                print(json.dumps(rows[-1]), flush=True)
        for variant in variants.split(","):
            mean = statistics.mean(float(str(r["psnr"])) for r in rows if r["variant"] == variant)
            print(f"convnet:width=16 BN train, fedavg + buffers, {variant}: {mean:.2f} dB")
        grey = statistics.mean(float(str(r["grey_psnr"])) for r in rows)
        print(f"grey image: {grey:.2f} dB")
        return
    chosen = [s for s in SETTINGS if not only or s in only.split(",")]
    table: dict[tuple[str, str], list[float]] = {}
    for setting in chosen:
        for index in parse_indices(photos, 20):
            for variant in VARIANTS:
                row = attack_once(setting, index, variant, iterations, tv, model_name)
                table.setdefault((setting, variant), []).append(float(str(row["psnr"])))
                print(json.dumps(row), flush=True)
    print(f"\n{model_name}, photos {photos}, {iterations} iterations, tv {tv}, attack seed 0")
    print(f"{'setting':24} {'plain dB':>9} {'aware dB':>9} {'gain dB':>8}")
    for setting in chosen:
        plain = statistics.mean(table[(setting, "plain")])
        aware = statistics.mean(table[(setting, "aware")])
        print(f"{setting:24} {plain:9.2f} {aware:9.2f} {aware - plain:+8.2f}")


if __name__ == "__main__":
    main()
