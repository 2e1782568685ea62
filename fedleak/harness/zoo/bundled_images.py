"""The bundled image sets, read from the packages that ship them (no network), as
``(images, labels)``: float32 ``[N, C, H, W]`` on [0, 1] and int64 labels, in a fixed order.

- ``digits``: scikit-learn's handwritten digits (pixel values 0..16 divided by 16).
- ``faces``: scikit-image's LFW subset (first 100 faces, last 100 non-faces).
- ``photos``: 20 RGB crops of 3×32×32 cut from ten photographs bundled with scikit-image
  (:data:`PHOTO_NAMES`). From each photograph, in this order: the centred square of side
  ``min(H, W)`` and the centred square of half that side, each resized to 32×32 with
  ``skimage.transform.resize(..., anti_aliasing=True)``; an alpha channel is dropped. The label
  is the index of the source photograph, the class names are the photographs' names.

:mod:`fedleak.harness.zoo.datasets` splits and describes them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from fedleak.harness.zoo.cache import cached_arrays

PHOTO_NAMES: tuple[str, ...] = (
    "astronaut",
    "chelsea",
    "coffee",
    "colorwheel",
    "hubble_deep_field",
    "immunohistochemistry",
    "logo",
    "motorcycle",
    "retina",
    "rocket",
)
PHOTO_CROP_FRACTIONS: tuple[float, ...] = (1.0, 0.5)  # side of the centred square / min(H, W)
PHOTO_SIZE = 32


@lru_cache(maxsize=1)
def read_digits() -> tuple[Tensor, Tensor]:
    """scikit-learn's 1797 digits, 1×8×8, labels 0-9."""
    def build() -> dict[str, np.ndarray]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        return {"images": (digits.images / 16.0).astype(np.float32)[:, None],
                "labels": digits.target.astype(np.int64)}

    arrays = cached_arrays("digits", _versions_key("scikit-learn", "numpy"), build,
                           names=("images", "labels"))
    return torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"])


@lru_cache(maxsize=1)
def read_faces() -> tuple[Tensor, Tensor]:
    """scikit-image's LFW subset, 200 images of 1×25×25: label 0 face, 1 non-face."""
    import skimage.data

    faces = skimage.data.lfw_subset()  # first 100 faces, last 100 non-faces (skimage docs)
    images = torch.as_tensor(faces, dtype=torch.float32).unsqueeze(1)
    half = images.shape[0] // 2
    labels = torch.cat([torch.zeros(half), torch.ones(images.shape[0] - half)]).long()
    return images, labels


@lru_cache(maxsize=1)
def read_photos() -> tuple[Tensor, Tensor]:
    """Two centred crops of each of :data:`PHOTO_NAMES`, 3×32×32, labelled by photograph.

    Resizing the ten photographs with anti-aliasing costs about 1.5 s of CPU, in every process
    that reads the set: the crops are computed once per machine and read from the cache
    (:func:`~fedleak.harness.zoo.cache.cached_arrays`) after that, keyed by the versions of
    the packages that compute them."""

    def build() -> dict[str, np.ndarray]:
        crops, labels = [], []
        for label, name in enumerate(PHOTO_NAMES):
            photo = read_photo(name)
            for fraction in PHOTO_CROP_FRACTIONS:
                crops.append(centred_square(photo, fraction))
                labels.append(label)
        images = np.ascontiguousarray(np.stack(crops).astype(np.float32).transpose(0, 3, 1, 2))
        return {"images": images, "labels": np.asarray(labels, dtype=np.int64)}

    key = _versions_key("scikit-image", "scipy", "numpy") + f"-{PHOTO_SIZE}-" + "-".join(
        f"{f:g}" for f in PHOTO_CROP_FRACTIONS) + f"-{len(PHOTO_NAMES)}"
    arrays = cached_arrays("photos", key, build, names=("images", "labels"))
    return torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"])


def _versions_key(*distributions: str) -> str:
    """``name-version`` of each installed distribution, and the cache format (``v1``)."""
    from importlib.metadata import version

    return "-".join(f"{d}-{version(d)}" for d in distributions) + "-v1"


def read_photo(name: str) -> np.ndarray:
    """A bundled scikit-image photograph as uint8 ``[H, W, 3]`` (alpha dropped)."""
    import skimage.data

    if name == "motorcycle":
        photo = skimage.data.stereo_motorcycle()[0]  # the left view of the stereo pair
    else:
        photo = getattr(skimage.data, name)()
    return photo[..., :3]


def centred_square(photo: np.ndarray, fraction: float) -> np.ndarray:
    """The centred square of side ``fraction * min(H, W)`` resized to ``PHOTO_SIZE``, on [0, 1]."""
    from skimage.transform import resize

    height, width = photo.shape[:2]
    side = round(fraction * min(height, width))
    top, left = (height - side) // 2, (width - side) // 2
    square = photo[top : top + side, left : left + side]
    return resize(square, (PHOTO_SIZE, PHOTO_SIZE), anti_aliasing=True)  # uint8 -> [0, 1]


def photo_crops(count: int, size: int = PHOTO_SIZE, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``count`` squares cut at random from the :data:`PHOTO_NAMES` photographs (crop i from
    photograph i mod 10, its label), each of side U(1/8, 1/2)·min(H, W) at a uniform position,
    resized to ``size``×``size`` with anti-aliasing: float32 ``[count, 3, size, size]`` on
    [0, 1]. A stand-in for a user's own photographs at their own resolution (as many as a
    partition needs), the same for the same ``seed``."""
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    photos = [read_photo(name) for name in PHOTO_NAMES]
    crops, labels = [], []
    for i in range(count):
        label = i % len(photos)
        photo = photos[label]
        height, width = photo.shape[:2]
        side = int(rng.uniform(0.125, 0.5) * min(height, width))
        top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
        crops.append(resize(photo[top:top + side, left:left + side], (size, size),
                            anti_aliasing=True))
        labels.append(label)
    images = torch.as_tensor(np.stack(crops), dtype=torch.float32).permute(0, 3, 1, 2)
    return images.contiguous(), torch.tensor(labels, dtype=torch.int64)


BUNDLED_READERS: dict[str, Callable[[], tuple[Tensor, Tensor]]] = {
    "digits": read_digits,
    "faces": read_faces,
    "photos": read_photos,
}
