"""``fedleak train-model``: a trained checkpoint on a labelled data set (the global model of
attacks on trained parameters)."""

from __future__ import annotations

from pathlib import Path

import click

from fedleak.harness.cli.options import check_device


@click.command("train-model")
@click.option("--dataset", default="digits", show_default=True,
              help="Labelled data: digits, faces, photos, or cifar10/cifar100/imagefolder "
                   "with --data-root.")
@click.option("--data-root", type=click.Path(file_okay=False), default=None)
@click.option("--model", default="convnet:width=16", show_default=True,
              help="Model name[:key=value,...]; the victim must use the same spec.")
@click.option("--epochs", default=20, show_default=True, type=click.IntRange(1))
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1))
@click.option("--lr", default=0.05, show_default=True, type=float,
              help="Peak SGD learning rate (cosine decay).")
@click.option("--seed", default=0, show_default=True,
              help="Seeds the initialisation (same meaning as the victim's --seed) and order.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Where to write the checkpoint (a plain state dict); a .json beside it "
                   "records how it was made.")
def train_model(dataset: str, data_root: str | None, model: str, epochs: int, batch_size: int,
                lr: float, seed: int, device: str, out: str) -> None:
    """Train a checkpoint on a labelled data set, for attacks on trained parameters."""
    import json

    import torch
    from tqdm import tqdm

    from fedleak.harness.federated.training import train_classifier
    from fedleak.harness.zoo.datasets import load_dataset
    from fedleak.harness.zoo.models import ModelSpec, build_model

    check_device(device)
    try:
        train = load_dataset(dataset, "train", data_root)
        test = load_dataset(dataset, "test", data_root)
        spec = ModelSpec.parse(model)
        torch.manual_seed(seed)
        network = build_model(spec, train.info.shape, train.info.num_classes)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    bar = tqdm(total=epochs, desc=f"training {spec} on {dataset}", unit="epoch")

    def on_epoch(epoch: int, loss: float, test_accuracy: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{test_accuracy:.1%}")

    result = train_classifier(network, train, test, epochs=epochs,
                              batch_size=batch_size, lr=lr, seed=seed,
                              device=device, on_epoch=on_epoch)
    bar.close()
    checkpoint = Path(out)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in network.state_dict().items()}, checkpoint)
    record = {"dataset": dataset, "model": str(spec), "seed": seed,
              "epochs": epochs, "batch_size": batch_size, "lr": lr,
              "train_loss": result.final_train_loss, "train_accuracy": result.train_accuracy,
              "test_accuracy": result.test_accuracy}
    checkpoint.with_suffix(".json").write_text(json.dumps(record, indent=2))
    click.echo(f"test accuracy {result.test_accuracy:.1%} (train {result.train_accuracy:.1%}); "
               f"checkpoint written to {checkpoint}")
