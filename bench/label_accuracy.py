"""Label recovery accuracy from one FedSGD gradient, for batches of B = 4, 8, 32 images.

For each model (an untrained ``convnet:width=16`` with model seed 0 and, with ``--checkpoint``,
a trained one from ``fedleak train-model``) and each B, the script draws ``--batches`` random
batches of the digits test split (8×8, 10 classes; batch seed s = 0, 1, ...), computes the user's
gradient exactly as the victim does (``local_update``), recovers the labels from it with
:func:`fedleak.attacks.labels.recover_labels` (iDLG for one image, the counting estimate for a
batch) and scores them as the victim's ``Score`` does (multiset overlap). It prints one row per
(model, B): mean, min and max accuracy over the batches, and the share of batches recovered
exactly.

    .venv/bin/fedleak train-model --dataset digits --model convnet:width=16 --epochs 5 \\
        --out runs/digits-convnet16.pt
    OMP_NUM_THREADS=1 .venv/bin/python bench/label_accuracy.py \\
        --checkpoint runs/digits-convnet16.pt [--batches 20] [--sizes 1,4,8,32]
"""

from __future__ import annotations

import statistics

import click
import torch

from fedleak.attacks.labels import recover_labels
from fedleak.harness.federated.observe import observe
from fedleak.harness.metrics.image_metrics import label_accuracy
from fedleak.harness.zoo.datasets import load_dataset
from fedleak.harness.zoo.models import build_model, load_checkpoint


def batch_accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   info: object, method: str = "dummy") -> float:
    """Label accuracy of the counting/iDLG recovery on one batch's FedSGD gradient."""
    observation = observe(model, images, labels, info)
    return label_accuracy(recover_labels(observation, method), labels)


@click.command()
@click.option("--model", "spec", default="convnet:width=16", show_default=True)
@click.option("--checkpoint", default=None, help="A trained state dict of the same model.")
@click.option("--sizes", default="1,4,8,32", show_default=True, help="Batch sizes B.")
@click.option("--batches", default=20, show_default=True, help="Random batches per B.")
@click.option("--model-seed", default=0, show_default=True)
@click.option("--methods", default="dummy,uniform", show_default=True,
              help="Counting variants: expected probabilities from dummy data, or all equal.")
def main(spec: str, checkpoint: str | None, sizes: str, batches: int, model_seed: int,
         methods: str) -> None:
    torch.set_num_threads(1)
    data = load_dataset("digits", "test")
    info = data.info
    models = {"untrained": None}
    if checkpoint:
        models["trained"] = checkpoint
    print(f"digits test split ({len(data)} images), {spec}, model seed {model_seed}, "
          f"{batches} random batches per B (batch seeds 0..{batches - 1}), FedSGD, 1 thread")
    print(f"{'model':>10}  {'method':>8}  {'B':>3}  {'mean acc':>8}  {'min':>6}  {'max':>6}  "
          f"{'exact':>6}")
    for kind, path in models.items():
        torch.manual_seed(model_seed)
        model = build_model(spec, info.shape, info.num_classes)
        if path:
            load_checkpoint(model, path)
        for method in methods.split(","):
            for size in (int(s) for s in sizes.split(",")):
                accs = []
                for seed in range(batches):
                    g = torch.Generator().manual_seed(seed)
                    index = torch.randperm(len(data), generator=g)[:size]
                    accs.append(batch_accuracy(model, data.images[index], data.labels[index],
                                               info, method))
                exact = sum(a == 1.0 for a in accs) / len(accs)
                print(f"{kind:>10}  {method:>8}  {size:>3}  {statistics.mean(accs):>8.3f}  "
                      f"{min(accs):>6.3f}  {max(accs):>6.3f}  {exact:>6.0%}")


if __name__ == "__main__":
    main()
