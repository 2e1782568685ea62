"""Plain vs defense-aware optimisation attacks at equal budget, same seeds (issue 19).

Threat model: honest-but-curious server; the defense chain is public (Kerckhoffs), its
randomness is not. For each defense setting and each photo, the same observation (lenet-zhu
untrained, model seed 0, one 32×32 bundled photo per round, FedSGD, defense randomness seeded
1000 + photo) is attacked by two variants with the same optimiser, budget and attack seed 0:
``plain`` (``objective=cosine``, ``replay=plain``: the non-adaptive attack of the README's
table) and ``aware`` (``objective=aware``, ``replay=aware``: the parts chosen from the
published defense chain, :mod:`fedleak.attacks.optimisation.adaptive`; ``--aware-objective SPEC``
replaces the objective; the default ``auto``, which weighs the two, is bench/adaptive_choice.py's).
``none`` is the undefended ceiling at this budget.

The optimiser (``--optimizer``) is Inverting Gradients' signed Adam (``inverting-gradients``,
``--evaluations`` iterations, tv + box) or L-BFGS (the ``dlg`` preset's optimiser and Gaussian
init with a tv prior: ``--evaluations``/20 steps of at most 20 objective evaluations each). The
budget is the number of objective evaluations, each one replay and one vector–Jacobian product.

The tv weight is chosen per setting and per variant (``--tune-photos``, default 5 and 10,
held out from ``--photos``; grid ``--tv-grid``): each variant gets the weight that gives it
the highest mean PSNR on the held-out photos, so the plain attack is as well tuned as the
aware one. ``--tv X`` fixes it instead. Prints one JSON line per attack and a table of mean
PSNR (dB) per setting, with the gain.

``--batchnorm`` measures the BatchNorm-statistics prior instead: the ConvNet of Inverting
Gradients at width 16 (model seed 0; untrained, or ``--trained``: trained in-process on 3,000
random crops of the ten bundled photographs, 4 epochs, seed 0, no download, cached in
``--checkpoint PATH``) with training-mode BatchNorm, FedAvg (one epoch, local batch = the
round's ``--batch`` photos, τ = 0.01, so one local step), the user returning its buffers:
``plain`` (bn = 0) against ``aware`` (bn = ``--bn-weight``, batch statistics inferred from the
returned buffers), matched PSNR, beside a flat grey image's and the per-image mean-colour
image's PSNR for scale.

    OMP_NUM_THREADS=1 python bench/adaptive.py [--photos 0-3] [--optimizer lbfgs] [--settings ..]
    OMP_NUM_THREADS=1 python bench/adaptive.py --batchnorm [--bn-weight 0.1] [--photos 0-3]
        [--trained --checkpoint /tmp/convnet16.pt] [--batch 8 --photos 0-7]
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from pathlib import Path

import click
import numpy as np
import torch

from fedleak.attacks import create_attack
from fedleak.defenses import build_chain
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.training import train_classifier
from fedleak.harness.metrics.image_metrics import psnr_per_image, score_reconstruction
from fedleak.harness.victim.selection import parse_indices
from fedleak.harness.zoo.bundled_images import PHOTO_NAMES, read_photo
from fedleak.harness.zoo.datasets import ImageDataset, denormalize, load_dataset
from fedleak.harness.zoo.models import build_model

SETTINGS: dict[str, list[tuple[str, dict[str, object]]]] = {
    "none": [],  # the ceiling at this budget: both variants run the plain cosine
    "prune p=0.9": [("prune", {"p": 0.9})],
    "prune p=0.99": [("prune", {"p": 0.99})],
    "dpsgd sigma=0.01 C=1": [("dpsgd", {"noise-multiplier": 0.01, "max-grad-norm": 1.0})],
    "quantize 4 bits": [("quantize", {"bits": 4})],
}
TRAINING_CROPS = 3000
TRAINING_EPOCHS = 4
VARIANTS = {"plain": {"objective": "cosine", "replay": "plain"},
            "aware": {"objective": "aware", "replay": "aware"}}


#: objective evaluations per L-BFGS step (the dlg preset's ``inner_iterations``)
LBFGS_INNER = 20
OPTIMIZERS = ("signed-adam", "lbfgs")


def attack_options(optimizer: str, evaluations: int, tv: float) -> tuple[str, dict[str, object]]:
    """The attack and options spending ``evaluations`` objective evaluations with ``optimizer``
    and tv weight ``tv``."""
    if optimizer == "lbfgs":
        return "dlg", {"iterations": max(1, evaluations // LBFGS_INNER),
                       "inner_iterations": LBFGS_INNER, "priors": f"tv:weight={tv:g}"}
    return "inverting-gradients", {"iterations": evaluations, "tv": tv}


def attack_once(setting: str, index: int, variant: str, evaluations: int, tv: float,
                model_name: str, aware_objective: str = "aware",
                optimizer: str = "signed-adam") -> dict[str, object]:
    """One attack on photo ``index`` under ``setting`` with the ``variant``'s parts."""
    data = load_dataset("photos", "all")
    info, image, label = data.info, data.images[index:index + 1], data.labels[index:index + 1]
    torch.manual_seed(0)
    model = build_model(model_name, info.shape, info.num_classes)
    chain = build_chain(SETTINGS[setting])
    observation = observe(model, image, label, info, defenses=chain,
                          generator=torch.Generator().manual_seed(1000 + index))
    parts = dict(VARIANTS[variant])
    if variant == "aware":
        parts["objective"] = aware_objective
    name, options = attack_options(optimizer, evaluations, tv)
    attack = create_attack(name, {**options, **parts})
    started = time.perf_counter()
    result = attack.reconstruct(observation, seed=0)
    out = denormalize(result.images, info).clamp(0, 1)
    return {"setting": setting, "photo": index, "variant": variant, "optimizer": optimizer,
            "tv": tv, "objective": result.extras["objective"],
            "replay": result.extras["replay"],
            "psnr": round(float(psnr_per_image(out, image)), 3),
            "label_ok": result.labels.tolist() == label.tolist(),
            "wall_s": round(time.perf_counter() - started, 1)}


def tune_tv(setting: str, variant: str, photos: list[int], grid: list[float],
            evaluations: int, model_name: str, aware_objective: str, optimizer: str) -> float:
    """The tv weight of ``grid`` with the highest mean PSNR on the held-out ``photos``."""
    scores = {}
    for tv in grid:
        rows = [attack_once(setting, i, variant, evaluations, tv, model_name, aware_objective,
                            optimizer) for i in photos]
        scores[tv] = statistics.mean(float(str(r["psnr"])) for r in rows)
        print(json.dumps({"tune": setting, "variant": variant, "tv": tv,
                          "held_out_psnr": round(scores[tv], 3)}), flush=True)
    return max(scores, key=lambda tv: scores[tv])


def training_crops(count: int, seed: int) -> ImageDataset:
    """``count`` random 32×32 crops of the ten bundled photographs (side 20–100 % of the
    shorter side, anywhere in the photograph, flipped at random), labelled by photograph:
    the training set of ``--trained`` (no download)."""
    from skimage.transform import resize

    info = load_dataset("photos", "all").info
    photos = [read_photo(name) for name in PHOTO_NAMES]
    rng = np.random.default_rng(seed)
    crops, labels = [], []
    for _ in range(count):
        label = int(rng.integers(len(photos)))
        photo = photos[label]
        height, width = photo.shape[:2]
        side = max(8, round(rng.uniform(0.2, 1.0) * min(height, width)))
        top, left = int(rng.integers(height - side + 1)), int(rng.integers(width - side + 1))
        crop = resize(photo[top:top + side, left:left + side], (32, 32), anti_aliasing=True)
        crops.append(crop[:, ::-1] if rng.random() < 0.5 else crop)
        labels.append(label)
    images = torch.as_tensor(np.stack(crops), dtype=torch.float32).permute(0, 3, 1, 2)
    return ImageDataset(images.contiguous(), torch.tensor(labels), info)


def convnet(trained: bool, checkpoint: str = "") -> tuple[torch.nn.Module, dict[str, object]]:
    """ConvNet width 16, model seed 0; with ``trained``, trained in-process (fixed seeds) on
    :func:`training_crops` and scored on the 20 bundled photos, or loaded from ``checkpoint``
    when that file exists (a state dict this function saved there before)."""
    info = load_dataset("photos", "all").info
    torch.manual_seed(0)
    model = build_model("convnet:width=16", info.shape, info.num_classes)
    if not trained:
        return model, {"model": "untrained"}
    described: dict[str, object] = {
        "model": f"trained ({TRAINING_CROPS} crops, {TRAINING_EPOCHS} epochs, seed 0)"}
    if checkpoint and Path(checkpoint).exists():
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
        described["loaded"] = checkpoint
    else:
        crops = training_crops(TRAINING_CROPS, seed=0)
        result = train_classifier(model, crops, load_dataset("photos", "all"),
                                  epochs=TRAINING_EPOCHS, batch_size=64, lr=0.05, seed=0)
        described.update(train_acc=round(result.train_accuracy, 3),
                         photos_acc=round(result.test_accuracy, 3))
        if checkpoint:
            torch.save(model.state_dict(), checkpoint)
    model.eval()
    return model, described


def batchnorm_once(model: torch.nn.Module, indices: list[int], variant: str, evaluations: int,
                   tv: float, weight: float, optimizer: str = "signed-adam"
                   ) -> dict[str, object]:
    """One FedAvg round on photos ``indices`` (one local step: local batch = all of them),
    training-mode BN, buffers returned; attacked plain (bn 0) or with the prior."""
    data = load_dataset("photos", "all")
    info, images, labels = data.info, data.images[indices], data.labels[indices]
    protocol = Protocol(kind="fedavg", local_epochs=1, batch_size=len(indices),
                        learning_rate=0.01)
    observation = observe(copy.deepcopy(model), images, labels, info, protocol,
                          return_buffers=True)
    options: dict[str, object] = {"iterations": evaluations, "tv": tv,
                                  "bn": weight if variant == "aware" else 0.0}
    if optimizer == "lbfgs":
        options.update(iterations=max(1, evaluations // LBFGS_INNER),
                       optimizer=f"lbfgs:inner={LBFGS_INNER}")
    started = time.perf_counter()
    result = create_attack("fedavg", options).reconstruct(observation, seed=0)
    out = denormalize(result.images, info).clamp(0, 1)
    score = score_reconstruction(out, images, result.labels, labels)
    grey = score_reconstruction(torch.full_like(images, 0.5), images, match=False)
    colour = score_reconstruction(images.mean((2, 3), keepdim=True).expand_as(images), images,
                                  match=False)
    return {"setting": "convnet BN fedavg buffers", "photos": indices, "variant": variant,
            "optimizer": optimizer,
            "bn": options["bn"], "bn_source": result.extras.get("bn_source"),
            "psnr": round(score.mean_psnr, 3),
            "per_image": [round(i.psnr, 2) for i in score.images],
            "grey_psnr": round(grey.mean_psnr, 3), "mean_colour_psnr": round(colour.mean_psnr, 3),
            "label_acc": score.label_accuracy, "objective": round(result.objective, 4),
            "wall_s": round(time.perf_counter() - started, 1)}


def batchnorm_table(photos: str, batch: int, trained: bool, variants: list[str],
                    evaluations: int, tv: float, weight: float, checkpoint: str = "",
                    optimizer: str = "signed-adam") -> None:
    """The ``--batchnorm`` measurement: rounds of ``batch`` consecutive photos of ``photos``."""
    indices = parse_indices(photos, 20)
    if len(indices) % batch:
        raise click.BadParameter(f"{len(indices)} photos do not split into rounds of {batch}")
    model, described = convnet(trained, checkpoint)
    print(json.dumps(described), flush=True)
    rows = []
    for start in range(0, len(indices), batch):
        for variant in variants:
            rows.append(batchnorm_once(model, indices[start:start + batch], variant,
                                       evaluations, tv, weight, optimizer))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nconvnet:width=16 {described['model']}, training-mode BN, FedAvg (one local step "
          f"of batch {batch}, τ 0.01) + buffers, photos {photos}, {optimizer}, {evaluations} "
          f"objective evaluations, tv {tv}, attack seed 0")
    for variant in variants:
        mean = statistics.mean(float(str(r["psnr"])) for r in rows if r["variant"] == variant)
        label = f"bn {weight:g}" if variant == "aware" else "bn 0"
        print(f"{variant:6} ({label}): {mean:.2f} dB")
    for key in ("grey_psnr", "mean_colour_psnr"):
        value = statistics.mean(float(str(r[key])) for r in rows if r["variant"] == variants[0])
        print(f"{key.replace('_psnr', '').replace('_', '-')} image: {value:.2f} dB")


@click.command()
@click.option("--photos", default="0-1", show_default=True)
@click.option("--evaluations", "--iterations", "evaluations", default=1200, show_default=True,
              help="Budget: objective evaluations per attack (signed Adam: iterations; "
                   f"L-BFGS: steps of {LBFGS_INNER}).")
@click.option("--optimizer", "optimizers", default="signed-adam", show_default=True,
              help="Both variants' optimiser, or a comma-separated list (signed-adam,lbfgs): "
                   "a table per optimiser, then the strongest plain against the strongest "
                   "aware attack per setting (the sweeps' worst case).")
@click.option("--tv", default=None, type=float,
              help="Fix the tv weight of both variants (default: tuned on --tune-photos).")
@click.option("--tune-photos", default="5,10", show_default=True,
              help="Held-out photos the tv weight is chosen on, per setting and variant.")
@click.option("--tv-grid", default="0.001,0.003,0.01,0.03,0.1", show_default=True)
@click.option("--model", "model_name", default="lenet-zhu", show_default=True)
@click.option("--settings", "only", default="", help="Comma-separated subset of the settings.")
@click.option("--aware-objective", default="aware", show_default=True,
              help="The aware variant's objective spec (aware: chosen from the published "
                   "defense; e.g. masked-cosine:outside=0;hinge=1 to tune on held-out photos).")
@click.option("--batchnorm", is_flag=True, help="Measure the BatchNorm prior (see above).")
@click.option("--bn-weight", default=0.1, show_default=True)
@click.option("--trained", is_flag=True, help="With --batchnorm: train the ConvNet first "
              "(in-process, fixed seeds, on random crops of the bundled photographs).")
@click.option("--checkpoint", default="", help="With --trained: load the trained ConvNet from "
              "this state dict when it exists, else train and save it there.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1),
              help="With --batchnorm: photos per round (consecutive photos of --photos).")
@click.option("--variants", default="plain,aware", show_default=True,
              help="Which of plain, aware to run.")
def main(photos: str, evaluations: int, optimizers: str, tv: float | None, tune_photos: str,
         tv_grid: str, model_name: str, only: str, aware_objective: str, batchnorm: bool,
         bn_weight: float, trained: bool, checkpoint: str, batch: int, variants: str) -> None:
    torch.set_num_threads(1)
    chosen_variants = [v for v in variants.split(",") if v]
    optimizer_list = [o for o in optimizers.split(",") if o]
    unknown = sorted(set(optimizer_list) - set(OPTIMIZERS))
    if unknown or not optimizer_list:
        raise click.BadParameter(f"unknown optimizer(s) {', '.join(unknown) or '(none)'}; "
                                 f"valid: {', '.join(OPTIMIZERS)}")
    if batchnorm:
        for optimizer in optimizer_list:
            batchnorm_table(photos, batch, trained, chosen_variants, evaluations,
                            1e-2 if tv is None else tv, bn_weight, checkpoint, optimizer)
        return
    test = parse_indices(photos, 20)
    held_out = parse_indices(tune_photos, 20)
    if tv is None and set(test) & set(held_out):
        raise click.BadParameter(f"--photos {photos} and --tune-photos {tune_photos} overlap: "
                                 "the tv weight must be chosen on photos it is not scored on")
    grid = [float(x) for x in tv_grid.split(",") if x]
    chosen = [s for s in SETTINGS if not only or s in only.split(",")]
    table: dict[tuple[str, str, str], float] = {}
    weights: dict[tuple[str, str, str], float] = {}
    for optimizer in optimizer_list:
        for setting in chosen:
            for variant in chosen_variants:
                key = (optimizer, setting, variant)
                same = (optimizer, setting, "plain")
                if not SETTINGS[setting] and variant == "aware" and same in table:
                    # nothing published: aware picks the plain parts, the same attack
                    weights[key], table[key] = weights[same], table[same]
                    continue
                weights[key] = tv if tv is not None else tune_tv(
                    setting, variant, held_out, grid, evaluations, model_name,
                    aware_objective, optimizer)
                psnrs = []
                for index in test:
                    row = attack_once(setting, index, variant, evaluations, weights[key],
                                      model_name, aware_objective, optimizer)
                    psnrs.append(float(str(row["psnr"])))
                    print(json.dumps(row), flush=True)
                table[key] = statistics.mean(psnrs)
    how = f"tv {tv:g}" if tv is not None else f"tv tuned on photos {tune_photos} from {tv_grid}"
    print(f"\n{model_name}, photos {photos}, {evaluations} objective evaluations, {how}, "
          "attack seed 0")
    for optimizer in optimizer_list:
        print(f"\n{optimizer}\n{'setting':24} {'plain dB':>9} {'(tv)':>6} {'aware dB':>9} "
              f"{'(tv)':>6} {'gain dB':>8}")
        for setting in chosen:
            plain = table.get((optimizer, setting, "plain"), math.nan)
            aware = table.get((optimizer, setting, "aware"), math.nan)
            print(f"{setting:24} {plain:9.2f} "
                  f"{weights.get((optimizer, setting, 'plain'), math.nan):6g} {aware:9.2f} "
                  f"{weights.get((optimizer, setting, 'aware'), math.nan):6g} "
                  f"{aware - plain:+8.2f}")
    if len(optimizer_list) > 1:
        print(f"\nstrongest per setting\n{'setting':24} {'plain dB':>9} {'by':>12} "
              f"{'aware dB':>9} {'by':>12} {'gain dB':>8}")
        for setting in chosen:
            best = {v: max(optimizer_list, key=lambda o, v=v: table.get((o, setting, v),
                                                                          -math.inf))
                    for v in ("plain", "aware")}
            plain = table.get((best["plain"], setting, "plain"), math.nan)
            aware = table.get((best["aware"], setting, "aware"), math.nan)
            print(f"{setting:24} {plain:9.2f} {best['plain']:>12} {aware:9.2f} "
                  f"{best['aware']:>12} {aware - plain:+8.2f}")


if __name__ == "__main__":
    main()
