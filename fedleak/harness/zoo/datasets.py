"""Labelled image data sets, as float32 tensors ``[N, C, H, W]`` on [0, 1].

Bundled sets ship inside installed packages and load without a network:

- ``digits``: scikit-learn's handwritten digits, 1797 images of 1×8×8, pixel values 0..16
  divided by 16, 10 classes ``"0"`` … ``"9"``.
- ``faces``: scikit-image's LFW subset, 200 grayscale images of 1×25×25 already on [0, 1].
  ``skimage.data.lfw_subset`` documents that the first 100 images are faces and the last 100
  are non-faces cut from the background of the same photographs, so label 0 = ``"face"``,
  label 1 = ``"non-face"``.
- ``photos``: 20 RGB crops of 3×32×32 cut from ten photographs bundled with scikit-image
  (:mod:`fedleak.harness.zoo.bundled_images` says how).

Bundled splits are fixed: image ``i`` (in the order above) belongs to ``"test"`` when
``i % 5 == 4`` and to ``"train"`` otherwise; ``"all"`` is every image in order.

Local sets read a folder given as ``data_root`` (``--data-root`` on the CLI):

- ``cifar10`` / ``cifar100``: torchvision's loaders over ``data_root`` holding
  ``cifar-10-batches-py`` / ``cifar-100-python`` (``download=True`` fetches them there).
  ``"train"`` and ``"test"`` are the official splits, ``"all"`` is train followed by test.
- ``imagefolder``: torchvision's ``ImageFolder`` (one sub-folder per class) over
  ``data_root/<split>`` when it exists, else over ``data_root`` with the fixed every-5th split
  above (``"all"`` reads ``data_root/train`` then ``data_root/test`` when both exist). Images
  are resized (shorter side) and centre-cropped to 3×32×32, or to the user's own resolution
  with ``imagefolder:size=N`` (``--image-size N``, e.g. 224); normalised with ImageNet's mean
  and standard deviation, or the user's own (``imagefolder:mean=0.5;0.5;0.5,std=...``,
  ``--normalization 0.5/0.5``); the description states it (``Describe`` publishes it).

Every torchvision use goes through :func:`import_torchvision` and is imported lazily, so
importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedleak.harness.zoo.bundled_images import BUNDLED_READERS, PHOTO_NAMES, PHOTO_SIZE
from fedleak.harness.zoo.folder_look import (  # noqa: F401  (re-exported)
    IMAGEFOLDER_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    FolderLook,
    folder_look,
    with_look,
)
from fedleak.harness.zoo.image_files import ImageFileError, read_image_folder
from fedleak.harness.zoo.torchvision_compat import import_torchvision

DATASET_NAMES: tuple[str, ...] = ("digits", "faces", "photos", "cifar10", "cifar100", "imagefolder")
SPLITS: tuple[str, ...] = ("train", "test", "all")
TEST_EVERY = 5  # bundled / un-split folders: image i is a test image iff i % 5 == 4

class DatasetError(ValueError):
    """A data set that cannot be loaded as asked; the message says what to change."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and an attacker may know about a data set: shape, classes, normalisation."""

    name: str
    shape: tuple[int, ...]  # (C, H, W) for images, (T,) for text
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]


@dataclass
class ImageDataset:
    """Images as float32 ``[N, C, H, W]`` on [0, 1] with int64 labels ``[N]``."""

    images: Tensor
    labels: Tensor
    info: DatasetInfo

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# Normalisation statistics. Bundled sets: per-channel mean and population standard deviation
# (over all pixels of all images) of the "train" split as loaded here, computed once with
#   pixels = load_dataset(name, "train").images.double().transpose(0, 1).flatten(1)
#   pixels.mean(1), pixels.std(1, correction=0)
# and rounded to 4 decimals (tests/harness/zoo/test_datasets.py recomputes them). CIFAR: the
# published statistics of the CIFAR-10 / CIFAR-100 training sets. imagefolder: the ImageNet
# statistics, since the folder's content is unknown until it is read.
_DIGITS_MEAN, _DIGITS_STD = (0.3058,), (0.3764,)
_FACES_MEAN, _FACES_STD = (0.3825,), (0.2711,)
_PHOTOS_MEAN, _PHOTOS_STD = (0.5739, 0.4376, 0.3544), (0.3074, 0.2719, 0.2616)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
CIFAR100_CLASSES: tuple[str, ...] = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

_BUNDLED_INFO: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        "digits", (1, 8, 8), 10, _DIGITS_MEAN, _DIGITS_STD, tuple(str(d) for d in range(10))
    ),
    "faces": DatasetInfo("faces", (1, 25, 25), 2, _FACES_MEAN, _FACES_STD, ("face", "non-face")),
    "photos": DatasetInfo(
        "photos",
        (3, PHOTO_SIZE, PHOTO_SIZE),
        len(PHOTO_NAMES),
        _PHOTOS_MEAN,
        _PHOTOS_STD,
        PHOTO_NAMES,
    ),
}
_CIFAR_INFO: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo("cifar10", (3, 32, 32), 10, CIFAR10_MEAN, CIFAR10_STD, CIFAR10_CLASSES),
    "cifar100": DatasetInfo(
        "cifar100", (3, 32, 32), 100, CIFAR100_MEAN, CIFAR100_STD, CIFAR100_CLASSES
    ),
}
_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


# --------------------------------------------------------------------------- public API


def load_dataset(
    name: str,
    split: str = "train",
    data_root: str | Path | None = None,
    download: bool = False,
) -> ImageDataset:
    """Load data set ``name`` (one of :data:`DATASET_NAMES`) and its ``split``.

    ``split`` is ``"train"``, ``"test"`` or ``"all"`` (see the module docstring for how each
    set splits). ``data_root`` and ``download`` matter only for ``cifar10``, ``cifar100`` and
    ``imagefolder``; the bundled sets ignore them.
    """
    name, look = folder_look(name)
    _check_name(name)
    _check_split(split)
    root = Path(data_root) if data_root is not None else None
    if name == "imagefolder":
        return _load_imagefolder(name, split, root, download, look)
    return _LOADERS[name](name, split, root, download)


def dataset_info(name: str, data_root: str | Path | None = None) -> DatasetInfo:
    """Shape, classes and normalisation of ``name`` without loading its images.

    Only ``imagefolder`` reads ``data_root`` (its class folders); the others are constants.
    """
    name, look = folder_look(name)
    _check_name(name)
    if name in _BUNDLED_INFO:
        return _BUNDLED_INFO[name]
    if name in _CIFAR_INFO:
        return _CIFAR_INFO[name]
    root = _require_imagefolder_root(data_root)
    folders, _ = _imagefolder_layout(root, "all")
    return _imagefolder_info(_folder_classes(folders), look)


def normalize(x: Tensor, info: DatasetInfo) -> Tensor:
    """Standardise per channel: ``(x - mean[c]) / std[c]`` for ``[N, C, H, W]`` or ``[C, H, W]``.

    Data without channel statistics (text: token ids) is the model's input as it is.
    """
    if not info.mean:
        return x
    mean, std = _channel_stats(x, info)
    return (x - mean) / std


def denormalize(x: Tensor, info: DatasetInfo) -> Tensor:
    """Undo :func:`normalize`: ``x * std[c] + mean[c]``, back to the [0, 1] image scale."""
    if not info.mean:
        return x
    mean, std = _channel_stats(x, info)
    return x * std + mean


def image_shape(info: DatasetInfo) -> tuple[int, int, int]:
    """``info.shape`` as (C, H, W); :class:`DatasetError` for data that is not images."""
    if len(info.shape) != 3:
        raise DatasetError(f"{info.name} holds token sequences of shape {tuple(info.shape)}, "
                           "not images (C, H, W); this needs an image data set")
    return (int(info.shape[0]), int(info.shape[1]), int(info.shape[2]))


# --------------------------------------------------------------------------- helpers


def _check_name(name: str) -> None:
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def _channel_stats(x: Tensor, info: DatasetInfo) -> tuple[Tensor, Tensor]:
    """Mean and std of ``info`` shaped ``[C, 1, 1]`` to broadcast over ``x``."""
    channels = len(info.mean)
    if x.dim() not in (3, 4) or x.shape[-3] != channels:
        raise ValueError(
            f"expected images [N, {channels}, H, W] or [{channels}, H, W] for {info.name}, "
            f"got shape {tuple(x.shape)}"
        )

    def as_column(values: tuple[float, ...]) -> Tensor:
        return torch.tensor(values, dtype=x.dtype, device=x.device).view(channels, 1, 1)

    return as_column(info.mean), as_column(info.std)


def _split_indices(count: int, split: str) -> Tensor:
    """Indices of ``split`` under the fixed rule: test iff ``i % TEST_EVERY == TEST_EVERY - 1``."""
    index = torch.arange(count)
    if split == "all":
        return index
    is_test = index % TEST_EVERY == TEST_EVERY - 1
    return index[is_test] if split == "test" else index[~is_test]


def _subset(images: Tensor, labels: Tensor, split: str, info: DatasetInfo) -> ImageDataset:
    index = _split_indices(labels.shape[0], split)
    return ImageDataset(images[index].contiguous(), labels[index].contiguous(), info)


# --------------------------------------------------------------------------- bundled sets


def _load_bundled(name: str, split: str, root: Path | None, download: bool) -> ImageDataset:
    images, labels = BUNDLED_READERS[name]()
    return _subset(images, labels, split, _BUNDLED_INFO[name])


# --------------------------------------------------------------------------- CIFAR


def _load_cifar(name: str, split: str, root: Path | None, download: bool) -> ImageDataset:
    folder = _CIFAR_FOLDERS[name]
    if root is None:
        raise DatasetError(
            f"{name} needs --data-root pointing at a folder containing {folder} "
            "(or add --download to fetch it into that folder)"
        )
    trains = {"train": [True], "test": [False], "all": [True, False]}[split]
    parts = [_read_cifar_part(name, root, train, download) for train in trains]
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    return ImageDataset(images, labels, _CIFAR_INFO[name])


def _read_cifar_part(name: str, root: Path, train: bool, download: bool) -> tuple[Tensor, Tensor]:
    """One official CIFAR split, converted from ``.data`` (uint8 ``[N, H, W, C]``)."""
    datasets = import_torchvision().datasets
    loader = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        part = loader(root=str(root), train=train, download=download)
    except OSError as error:  # includes a failed --download (URLError)
        raise DatasetError(
            f"{name}: could not read or download {_CIFAR_FOLDERS[name]} into {root} ({error}); "
            "check the network, or download it yourself and point --data-root at its parent"
        ) from error
    except RuntimeError as error:
        raise DatasetError(
            f"{name}: no valid {_CIFAR_FOLDERS[name]} under --data-root {root} ({error}); "
            f"point --data-root at the folder containing {_CIFAR_FOLDERS[name]} "
            "(or add --download to fetch it there)"
        ) from error
    images = torch.from_numpy(np.asarray(part.data)).permute(0, 3, 1, 2).float().div_(255.0)
    return images.contiguous(), torch.as_tensor(part.targets, dtype=torch.int64)


# --------------------------------------------------------------------------- image folders


def _load_imagefolder(name: str, split: str, root: Path | None, download: bool,
                      look: FolderLook | None = None) -> ImageDataset:
    look = look or FolderLook()
    root = _require_imagefolder_root(root)
    folders, apply_split = _imagefolder_layout(root, split)
    info = _imagefolder_info(_folder_classes(folders), look)
    parts = [_read_image_folder(folder, look.size) for folder in folders]
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    if apply_split:
        return _subset(images, labels, split, info)
    return ImageDataset(images, labels, info)


def _require_imagefolder_root(data_root: str | Path | None) -> Path:
    if data_root is None:
        raise DatasetError(
            "imagefolder needs --data-root pointing at a folder with one sub-folder of images "
            "per class (optionally inside train/ and test/)"
        )
    root = Path(data_root)
    if not root.is_dir():
        raise DatasetError(f"imagefolder: --data-root {root} is not a folder; point it at one")
    return root


def _imagefolder_layout(root: Path, split: str) -> tuple[list[Path], bool]:
    """Folders to read for ``split`` and whether the fixed every-5th split is still to apply."""
    has = {s: (root / s).is_dir() for s in ("train", "test")}
    if split == "all" and all(has.values()):
        return [root / "train", root / "test"], False
    if split != "all" and has[split]:
        return [root / split], False
    if any(has.values()):
        missing = [s for s, present in has.items() if not present]
        raise DatasetError(
            f"imagefolder: {root} has a train/ or test/ folder but no {'/ '.join(missing)}/; "
            "provide both, or put the class folders directly under --data-root"
        )
    return [root], split != "all"


def _folder_classes(folders: list[Path]) -> tuple[str, ...]:
    """Sorted class sub-folder names, which must agree across ``folders``."""
    found = [tuple(sorted(e.name for e in os.scandir(f) if e.is_dir())) for f in folders]
    if not found[0]:
        raise DatasetError(f"imagefolder: {folders[0]} has no class sub-folders; add one per class")
    if any(classes != found[0] for classes in found):
        raise DatasetError(
            f"imagefolder: class folders differ between {', '.join(map(str, folders))}; "
            "use the same class names in each"
        )
    return found[0]


def _imagefolder_info(classes: tuple[str, ...], look: FolderLook | None = None
                      ) -> DatasetInfo:
    look = look or FolderLook()
    return DatasetInfo(look.name(), (3, look.size, look.size), len(classes), look.mean,
                       look.std, classes)


def _read_image_folder(folder: Path, size: int = IMAGEFOLDER_SIZE) -> tuple[Tensor, Tensor]:
    """All images under ``folder``, each file checked first (:func:`read_image_folder`)."""
    try:
        return read_image_folder(folder, _folder_classes([folder]), size)
    except ImageFileError as err:
        raise DatasetError(str(err)) from None


_LOADERS: dict[str, Callable[[str, str, Path | None, bool], ImageDataset]] = {
    "digits": _load_bundled,
    "faces": _load_bundled,
    "photos": _load_bundled,
    "cifar10": _load_cifar,
    "cifar100": _load_cifar,
    "imagefolder": _load_imagefolder,
}
