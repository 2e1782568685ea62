"""Analytic inversion (Geiping et al. Prop. 3.1): PSNR and wall time on an MLP, feature
recovery on CNNs, for one image and for batches.

For each (data set, model, B) the script builds the round as the harness does (the victim's
``local_update`` at model seed 0 on the first B images of the train split), runs the
``analytic`` attack and prints: for an MLP the PSNR of the recovered image (B = 1) or of the
mixture against its best-matching image (B > 1); for a CNN the cosine similarity and relative
error of the recovered classifier input against the true features (``fedleak.harness.
feature_scoring``, as the victim's Score computes them); and the attack's wall time (median
of ``--repeats`` runs, one thread).

    OMP_NUM_THREADS=1 .venv/bin/python bench/analytic_inversion.py

Across two processes: ``fedleak victim serve --dataset digits --model mlp`` and
``fedleak attack --victim HOST:PORT --attack analytic``.
"""

from __future__ import annotations

import statistics
import time

import click
import torch

from fedleak.attacks import create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.victim.scoring.features import layer_inputs, score_features
from fedleak.harness.zoo.datasets import denormalize, load_dataset, normalize
from fedleak.harness.zoo.models import build_model

CASES = [("digits", "mlp", 1), ("photos", "mlp", 1), ("digits", "mlp", 4), ("digits", "mlp", 8),
         ("photos", "lenet-zhu", 1), ("photos", "convnet:width=16", 2),
         ("digits", "convnet:width=16", 8)]


def run_case(dataset: str, spec: str, batch: int, repeats: int) -> str:
    data = load_dataset(dataset, "train")
    info, images, labels = data.info, data.images[:batch], data.labels[:batch]
    torch.manual_seed(0)
    model = build_model(spec, info.shape, info.num_classes)
    observation = observe(model, images, labels, info)
    attack = create_attack("analytic")
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = attack.reconstruct(observation)
        walls.append(time.perf_counter() - started)
    ms = statistics.median(walls) * 1000
    head = f"{dataset:>7} {spec:>18} B={batch:<3}"
    if result.has_images:
        recovered = denormalize(result.images, info).clamp(0, 1)
        score = score_reconstruction(recovered, images)
        worst = min(s.psnr for s in score.images)
        return (f"{head} image    matched mean PSNR {score.mean_psnr:6.2f} dB (worst "
                f"{worst:6.2f}), {result.extras['separated']} separated   {ms:7.2f} ms")
    truth = layer_inputs(model, dict(model.named_parameters()), dict(model.named_buffers()),
                         normalize(images, info), result.feature_layer)
    scored = score_features(result.features, truth)
    return (f"{head} features ({result.feature_layer}) cosine {scored.mean_cosine:.6f}, "
            f"relative error {scored.mean_relative_error:.2e}   {ms:7.2f} ms")


@click.command()
@click.option("--repeats", default=5, show_default=True)
def main(repeats: int) -> None:
    torch.set_num_threads(1)
    print("analytic inversion, untrained models (seed 0), first B train images, FedSGD, "
          f"1 thread, median of {repeats} runs")
    for case in CASES:
        print(run_case(*case, repeats))


if __name__ == "__main__":
    main()
