"""The victim's private data and model: what ``--help`` lists under "Private data" and "Model".

Each concern is one typed object (its fields are the options' parameter names) and one
decorator that declares its options and hands the object to the command; an option of the
concern is added in both, here.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from fedleak.harness.cli.options import F, packed


@dataclass(frozen=True)
class DataOptions:
    """The private pool: which data set, which images, how many per round."""

    dataset: str
    split: str
    images: str | None
    shuffle: bool
    data_root: str | None
    image_size: int | None
    normalization: str | None
    download: bool
    batch_size: int


def data_options(function: F) -> F:
    """The private data options, handed to the command as ``data``."""
    return packed(DataOptions, "data", [
        click.option("--dataset", default="photos", show_default=True,
                     help="Private data: digits, faces, photos (bundled) or cifar10, cifar100, "
                          "imagefolder (under --data-root); text: shakespeare (bundled) or "
                          "textfile (--data-root FILE or folder of .txt), with a text model "
                          "(gpt2, bert, hf)."),
        click.option("--split", default="train", show_default=True,
                     help="train, test or all."),
        click.option("--images", default=None,
                     help="Restrict the private pool to these indices of the split, e.g. 0-3,7."),
        click.option("--shuffle/--no-shuffle", default=False, show_default=True,
                     help="Shuffle the private pool with --seed."),
        click.option("--data-root", type=click.Path(), default=None,
                     help="Folder holding cifar10/cifar100/imagefolder data; textfile: a .txt "
                          "file or a folder of them."),
        click.option("--image-size", type=click.IntRange(8), default=None,
                     help="imagefolder: resize and centre-crop your images to N×N (e.g. 224) "
                          "instead of 32×32."),
        click.option("--normalization", default=None, metavar="MEAN/STD",
                     help="imagefolder: the normalisation your model was trained with, each one "
                          "number or three (0.5/0.5; default ImageNet's); Describe states it."),
        click.option("--download", is_flag=True,
                     help="Download cifar10/cifar100 into --data-root."),
        click.option("--batch-size", "-n", default=1, show_default=True, type=click.IntRange(1),
                     help="Private images per round (n)."),
    ])(function)


@dataclass(frozen=True)
class ModelOptions:
    """The model the user trains: its architecture, weights, initialisation and device."""

    model: str
    checkpoint: str | None
    seed: int
    device: str


def model_options(function: F) -> F:
    """The model options, handed to the command as ``model``."""
    return packed(ModelOptions, "model", [
        click.option("--model", default="lenet-zhu", show_default=True,
                     help="Model name[:key=value,...], e.g. convnet:width=64 (see `fedleak "
                          "list`), or your own model as an importable factory module:factory "
                          "(e.g. pytorchexample.task:Net, its folder on PYTHONPATH), called with "
                          "no arguments."),
        click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="State dict of a trained model: the federation's global model."),
        click.option("--seed", default=0, show_default=True,
                     help="Seeds model init and shuffling."),
        click.option("--device", default="cpu", show_default=True,
                     help="Where local training runs."),
    ])(function)
