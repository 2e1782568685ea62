"""Data sets: bundled sets load offline with the documented shapes, splits and statistics."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedleak.harness.zoo import datasets
from fedleak.harness.zoo.datasets import (
    DATASET_NAMES,
    DatasetError,
    dataset_info,
    denormalize,
    load_dataset,
    normalize,
)
from fedleak.harness.zoo.torchvision_compat import import_torchvision

BUNDLED = {
    # name: (shape, classes, total images)
    "digits": ((1, 8, 8), 10, 1797),
    "faces": ((1, 25, 25), 2, 200),
    "photos": ((3, 32, 32), 10, 20),
}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_set_loads_with_documented_shape_and_range(name: str) -> None:
    shape, classes, total = BUNDLED[name]
    data = load_dataset(name, "all")
    assert data.images.dtype == torch.float32 and data.labels.dtype == torch.int64
    assert data.images.shape == (total, *shape)
    assert data.info.shape == shape and data.info.num_classes == classes
    assert len(data.info.class_names) == classes
    assert 0.0 <= float(data.images.min()) and float(data.images.max()) <= 1.0
    assert float(data.images.max()) > 0.5  # really on [0, 1], not [0, 1/255]
    assert set(data.labels.tolist()) == set(range(classes))
    assert dataset_info(name) == data.info


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_splits_are_disjoint_complete_and_deterministic(name: str) -> None:
    everything = load_dataset(name, "all")
    train, test = load_dataset(name, "train"), load_dataset(name, "test")
    assert len(train) + len(test) == len(everything)
    assert len(test) == len(everything) // 5
    # every test image is everything[i] with i % 5 == 4, and no train image is
    assert torch.equal(test.images, everything.images[4::5])
    assert not any(torch.equal(t, test.images[0]) for t in train.images)
    again = load_dataset(name, "train")
    assert torch.equal(again.images, train.images) and torch.equal(again.labels, train.labels)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_hard_coded_statistics_are_those_of_the_train_split(name: str) -> None:
    train = load_dataset(name, "train")
    per_channel = train.images.double().transpose(0, 1).flatten(1)
    assert per_channel.mean(1).tolist() == pytest.approx(train.info.mean, abs=1e-4)
    assert per_channel.std(1, correction=0).tolist() == pytest.approx(train.info.std, abs=1e-4)


def test_faces_first_half_are_faces() -> None:
    faces = load_dataset("faces", "all")
    assert faces.labels[:100].eq(0).all() and faces.labels[100:].eq(1).all()
    assert faces.info.class_names == ("face", "non-face")


def test_photos_labels_name_their_source_photograph() -> None:
    photos = load_dataset("photos", "all")
    assert photos.info.class_names == datasets.PHOTO_NAMES
    assert photos.labels.tolist() == [i // 2 for i in range(20)]


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_normalize_round_trips(name: str) -> None:
    data = load_dataset(name, "test")
    batch = data.images[:4]
    normalised = normalize(batch, data.info)
    assert torch.allclose(denormalize(normalised, data.info), batch, atol=1e-6)
    assert torch.allclose(denormalize(normalize(batch[0], data.info), data.info), batch[0])
    mean = torch.tensor(data.info.mean).view(-1, 1, 1)
    std = torch.tensor(data.info.std).view(-1, 1, 1)
    assert torch.allclose(normalised, (batch - mean) / std)


def test_normalize_rejects_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match="expected images"):
        normalize(torch.zeros(2, 3, 8, 8), dataset_info("digits"))


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(DatasetError) as error:
        load_dataset("mnist")
    for name in DATASET_NAMES:
        assert name in str(error.value)


def test_unknown_split_lists_the_valid_ones() -> None:
    with pytest.raises(DatasetError, match="train, test, all"):
        load_dataset("digits", "validation")


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_without_data_root_says_to_pass_it(name: str) -> None:
    with pytest.raises(DatasetError, match="--data-root"):
        load_dataset(name)


def test_cifar_with_empty_data_root_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cifar-10-batches-py"):
        load_dataset("cifar10", "test", data_root=tmp_path)


def test_cifar_converts_uint8_hwc_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torchvision loader is replaced by a stub with CIFAR's ``.data`` / ``.targets``."""

    class FakeCifar:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            count = 5 if train else 3
            self.data = np.full((count, 32, 32, 3), 255 if train else 51, dtype=np.uint8)
            self.targets = list(range(count))

    fake = types.SimpleNamespace(datasets=types.SimpleNamespace(CIFAR10=FakeCifar))
    monkeypatch.setattr(datasets, "import_torchvision", lambda: fake)
    data = load_dataset("cifar10", "all", data_root="/nowhere")
    assert data.images.shape == (8, 3, 32, 32) and data.images.dtype == torch.float32
    assert data.images[:5].eq(1.0).all() and torch.allclose(data.images[5:], torch.tensor(0.2))
    assert data.labels.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert data.info == dataset_info("cifar10") and len(data.info.class_names) == 10
    assert len(dataset_info("cifar100").class_names) == 100


def _write_image_folder(root: Path, per_class: int = 5) -> None:
    rng = np.random.default_rng(0)
    for colour, name in ((0, "cats"), (2, "dogs")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 64, size=(40, 48, 3), dtype=np.uint8)
            pixels[..., colour] = 255
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def test_imagefolder_loads_and_splits(tmp_path: Path) -> None:
    _write_image_folder(tmp_path)
    everything = load_dataset("imagefolder", "all", data_root=tmp_path)
    assert everything.images.shape == (10, 3, 32, 32)
    assert everything.images.dtype == torch.float32
    assert everything.info.class_names == ("cats", "dogs")
    assert everything.labels.tolist() == [0] * 5 + [1] * 5
    assert everything.images[:5, 0].min() > 0.99 and everything.images[5:, 2].min() > 0.99
    train = load_dataset("imagefolder", "train", data_root=tmp_path)
    test = load_dataset("imagefolder", "test", data_root=tmp_path)
    assert len(train) == 8 and len(test) == 2
    assert dataset_info("imagefolder", tmp_path) == everything.info


def test_imagefolder_uses_split_subfolders(tmp_path: Path) -> None:
    _write_image_folder(tmp_path / "train", per_class=3)
    _write_image_folder(tmp_path / "test", per_class=1)
    assert len(load_dataset("imagefolder", "train", data_root=tmp_path)) == 6
    assert len(load_dataset("imagefolder", "test", data_root=tmp_path)) == 2
    assert len(load_dataset("imagefolder", "all", data_root=tmp_path)) == 8


def test_imagefolder_without_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--data-root"):
        load_dataset("imagefolder")
    with pytest.raises(DatasetError, match="not a folder"):
        load_dataset("imagefolder", data_root=tmp_path / "missing")
    with pytest.raises(DatasetError, match="no class sub-folders"):
        load_dataset("imagefolder", data_root=tmp_path)


def test_import_torchvision_gives_usable_datasets_and_transforms() -> None:
    torchvision = import_torchvision()
    assert import_torchvision() is torchvision is sys.modules["torchvision"]
    to_tensor = torchvision.transforms.ToTensor()
    image = to_tensor(Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)))
    assert image.shape == (3, 4, 4)
    assert hasattr(torchvision.datasets, "ImageFolder")
