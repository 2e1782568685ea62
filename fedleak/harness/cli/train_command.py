"""``fedleak train-model``: a trained checkpoint on a labelled data set (the global model of
attacks on trained parameters)."""

from __future__ import annotations

from pathlib import Path

import click

from fedleak.harness.cli.options import check_device


@click.command("train-model")
@click.option("--dataset", default="digits", show_default=True,
              help="Labelled data: digits, faces, photos, or cifar10/cifar100/imagefolder "
                   "with --data-root; text: shakespeare or textfile (a text model's train "
                   "split, Adam on the user's loss: docs/text.md).")
@click.option("--data-root", type=click.Path(), default=None)
@click.option("--model", default="convnet:width=16", show_default=True,
              help="Model name[:key=value,...]; the victim must use the same spec.")
@click.option("--epochs", default=20, show_default=True, type=click.IntRange(1))
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1))
@click.option("--lr", default=None, type=float,
              help="Peak SGD learning rate (cosine decay), default 0.05; text: Adam's, "
                   "default 1e-3.")
@click.option("--steps", default=None, type=click.IntRange(1),
              help="Text data sets: stop after this many optimiser steps (brief training).")
@click.option("--seq-len", default=32, show_default=True, type=click.IntRange(2),
              help="Text data sets: tokens per sequence (the victim's --seq-len).")
@click.option("--seed", default=0, show_default=True,
              help="Seeds the initialisation (same meaning as the victim's --seed) and order.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Where to write the checkpoint (a plain state dict); a .json beside it "
                   "records how it was made.")
def train_model(dataset: str, data_root: str | None, model: str, epochs: int, batch_size: int,
                lr: float | None, steps: int | None, seq_len: int, seed: int, device: str,
                out: str) -> None:
    """Train a checkpoint on a labelled data set, for attacks on trained parameters."""
    import json

    from fedleak.harness.victim.text_pool import is_text_dataset

    if is_text_dataset(dataset):
        train_text_checkpoint(dataset, data_root, model, epochs, batch_size, lr or 1e-3, steps,
                              seq_len, seed, Path(out))
        return
    lr = 0.05 if lr is None else lr

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


def train_text_checkpoint(dataset: str, data_root: str | None, model: str, epochs: int,
                          batch_size: int, lr: float, steps: int | None, seq_len: int,
                          seed: int, out: Path) -> None:
    """``train-model`` on a text data set: the victim's model and task, Adam, the user's loss."""
    import json

    import torch

    from fedleak.harness.federated.text_training import text_utility, train_text_model
    from fedleak.harness.victim.settings import VictimSettings
    from fedleak.harness.victim.text_pool import load_text_pool
    from fedleak.harness.zoo.text.text_models import build_text_model

    try:
        settings = VictimSettings(dataset=dataset, model=model, data_root=data_root,
                                  seq_len=seq_len, seed=seed)
        train = load_text_pool(settings)
        test = load_text_pool(VictimSettings(dataset=dataset, model=model, split="test",
                                             data_root=data_root, seq_len=seq_len, seed=seed))
        torch.manual_seed(seed)
        network = build_text_model(model, train.info)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    done = train_text_model(network, train, epochs=epochs, batch_size=batch_size, lr=lr,
                            seed=seed, steps=steps)
    score = text_utility(network, test.select(torch.arange(min(256, len(test)))))
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in network.state_dict().items()}, out)
    record = {"dataset": dataset, "model": model, "seed": seed, "epochs": epochs,
              "steps": done, "batch_size": batch_size, "lr": lr, "seq_len": seq_len,
              "test_accuracy": score.accuracy, "test_perplexity": score.perplexity}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    click.echo(f"{done} steps; test accuracy {score.accuracy:.1%}"
               + (f", perplexity {score.perplexity:.1f}" if score.perplexity else "")
               + f"; checkpoint written to {out}")
