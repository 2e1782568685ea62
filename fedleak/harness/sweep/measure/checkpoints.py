"""Trained checkpoints of a sweep's ``trained = true`` points: trained once, shared by points.

A point's victims start from the seeded init (``trained = false``), from a state dict the spec
names, or from a checkpoint the sweep trains once per (data set, model, seed, epochs) into
``RUN/checkpoints/`` (written atomically, so a killed sweep never leaves half a file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.victim.text_pool import is_text_dataset


def checkpoint_path(point: Point, run_dir: Path) -> str | None:
    """The state dict the point's victims start from, or None for the seeded init."""
    if isinstance(point.trained, str):
        return point.trained
    if not point.trained or point.victim:
        return None
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in point.model)
    name = f"{point.dataset}-{slug}-seed{point.seed}-e{point.train_epochs}.pt"
    return str((run_dir / "checkpoints" / name).resolve())


def ensure_checkpoint(point: Point, run_dir: Path, echo: Callable[[str], Any] = print) -> None:
    """Train the checkpoint of a ``trained = true`` point once (written atomically)."""
    path = checkpoint_path(point, run_dir)
    if point.trained is not True or path is None or Path(path).exists():
        return
    import torch

    from fedleak.harness.federated.training import train_classifier
    from fedleak.harness.zoo.datasets import load_dataset
    from fedleak.harness.zoo.models import ModelSpec, build_model

    echo(f"training {point.model} on {point.dataset} for {point.train_epochs} epochs "
         f"(checkpoint for trained points)")
    if is_text_dataset(point.dataset):
        text_checkpoint(point, path, echo)
        return
    train = load_dataset(point.dataset, "train", point.data_root)
    test = load_dataset(point.dataset, "test", point.data_root)
    torch.manual_seed(point.seed)
    model = build_model(ModelSpec.parse(point.model), train.info.shape, train.info.num_classes)
    result = train_classifier(model, train, test, epochs=point.train_epochs, seed=point.seed)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(path + ".partial")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, partial)
    partial.replace(path)
    echo(f"checkpoint {path}: test accuracy {result.test_accuracy:.1%}")


def text_checkpoint(point: Point, path: str, echo: Callable[[str], Any]) -> None:
    """Train a text point's model briefly on the train split (Adam, the user's loss)."""
    import dataclasses

    import torch

    from fedleak.harness.federated.text_training import text_utility, train_text_model
    from fedleak.harness.victim.text_pool import load_text_pool
    from fedleak.harness.zoo.text.text_models import build_text_model

    settings = point.victim_settings()
    train = load_text_pool(dataclasses.replace(settings, split="train"))
    test = load_text_pool(dataclasses.replace(settings, split="test"))
    torch.manual_seed(point.seed)
    model = build_text_model(point.model, train.info)
    train_text_model(model, train, epochs=point.train_epochs, seed=point.seed)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(path + ".partial")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, partial)
    partial.replace(path)
    score = text_utility(model, test.select(torch.arange(min(256, len(test)))))
    echo(f"checkpoint {path}: test accuracy {score.accuracy:.1%}" + (
        f", perplexity {score.perplexity:.4g}" if score.perplexity is not None else ""))
