"""The files of a user's image folder, each checked before it is decoded.

``--dataset imagefolder`` reads the user's own files, so every one is judged at start, with
its path and the reason when it cannot be used (Pillow's own guards, ``Image.MAX_IMAGE_PIXELS``
and a full ``load``, turned into named refusals):

- **empty** (0 bytes), **not an image** Pillow can identify (garbage, text saved as ``.png``);
- **over the pixel ceiling** (:func:`max_image_pixels`: width × height read from the header,
  before any pixel is decoded; default :data:`MAX_IMAGE_PIXELS`, ``FEDLEAK_MAX_IMAGE_PIXELS``
  sets it) — a decompression bomb costs nothing;
- a **sliver** (aspect ratio above :data:`MAX_ASPECT_RATIO`): resizing its shorter side to the
  folder's size would make it ``size`` × ``size·ratio`` pixels before the crop (1×100,000 took
  13 s);
- **animated** (more than one frame: GIF, APNG, WebP): which frame is the private image is
  not defined; save the one meant as a still image;
- **truncated** or otherwise undecodable (the full decode fails).

Every refused file is named at once (one error, the first :data:`LISTED` of them); files whose
extension is not an image's are skipped, and the skip is said (:class:`SkippedFilesWarning`).
The files are read in torchvision ``ImageFolder``'s order (class folders sorted, files sorted
within each, sub-folders walked), so labels and order are those it gives.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image
    from torch import Tensor

#: Extensions read as images (torchvision's, and GIF: a still GIF is an image too).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                    ".gif")
#: Default ceiling on width × height of one file (64 Mpx: a 8000×8000 photograph).
MAX_IMAGE_PIXELS = 64_000_000
#: Longest side over shortest side beyond which a file is refused as a sliver.
MAX_ASPECT_RATIO = 64
#: Refused files named in one error (the count of the rest follows).
LISTED = 20


class ImageFileError(ValueError):
    """Files of an image folder that cannot be used, each with its path and reason."""


class SkippedFilesWarning(UserWarning):
    """Files of an image folder skipped because their extension is not an image's."""


@dataclass(frozen=True)
class FolderFiles:
    """The usable image files of a folder (path, class index) and the files skipped."""

    files: tuple[tuple[Path, int], ...]
    skipped: tuple[Path, ...]


def max_image_pixels() -> int:
    """The pixel ceiling: ``FEDLEAK_MAX_IMAGE_PIXELS`` when set, else :data:`MAX_IMAGE_PIXELS`."""
    raw = os.environ.get("FEDLEAK_MAX_IMAGE_PIXELS", "")
    if not raw:
        return MAX_IMAGE_PIXELS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ImageFileError(f"FEDLEAK_MAX_IMAGE_PIXELS={raw!r}: give a positive whole number of "
                             "pixels (width × height), e.g. 64000000")
    return value


def folder_files(folder: Path, classes: tuple[str, ...]) -> FolderFiles:
    """Every file under ``folder/<class>`` in ``ImageFolder``'s order, image files apart."""
    files: list[tuple[Path, int]] = []
    skipped: list[Path] = []
    for index, name in enumerate(classes):
        found = 0
        for root, _, names in sorted(os.walk(folder / name, followlinks=True)):
            for file_name in sorted(names):
                path = Path(root) / file_name
                if file_name.lower().endswith(IMAGE_EXTENSIONS):
                    files.append((path, index))
                    found += 1
                else:
                    skipped.append(path)
        if not found:
            raise ImageFileError(f"imagefolder: the class folder {folder / name} holds no image "
                                 f"file ({', '.join(IMAGE_EXTENSIONS)}); add images or remove "
                                 "the folder")
    return FolderFiles(tuple(files), tuple(skipped))


def say_skipped(skipped: tuple[Path, ...]) -> None:
    """Warn (:class:`SkippedFilesWarning`) about files skipped for their extension."""
    if not skipped:
        return
    shown = ", ".join(str(p) for p in skipped[:LISTED])
    more = f" and {len(skipped) - LISTED} more" if len(skipped) > LISTED else ""
    warnings.warn(f"imagefolder: skipped {len(skipped)} file(s) that are not images by their "
                  f"extension ({', '.join(IMAGE_EXTENSIONS)}): {shown}{more}",
                  SkippedFilesWarning, stacklevel=2)


def open_image(path: Path, ceiling: int) -> Image.Image:
    """Return ``path`` decoded as an RGB Pillow image; :class:`ImageFileError` naming the
    reason (module docstring) when it cannot be used."""
    from PIL import Image, UnidentifiedImageError  # noqa: F811 - at run time, lazily

    try:
        size = path.stat().st_size
    except OSError as err:
        raise ImageFileError(f"{path}: cannot be read ({err.strerror})") from None
    if size == 0:
        raise ImageFileError(f"{path}: is empty (0 bytes)")
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # the ceiling below is checked from the header, named
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > ceiling:
                    raise ImageFileError(
                        f"{path}: {width}×{height} = {width * height:,} pixels, over the "
                        f"ceiling of {ceiling:,} (FEDLEAK_MAX_IMAGE_PIXELS): downscale it or "
                        "raise the ceiling")
                if min(width, height) < 1 or max(width, height) > \
                        MAX_ASPECT_RATIO * min(width, height):
                    raise ImageFileError(
                        f"{path}: {width}×{height} pixels, a sliver (aspect ratio over "
                        f"{MAX_ASPECT_RATIO}:1) that resizing would blow up; crop it")
                frames = int(getattr(image, "n_frames", 1))
                if frames > 1:
                    raise ImageFileError(f"{path}: animated ({frames} frames); save the frame "
                                         "meant as a still image (e.g. as PNG)")
                return image.convert("RGB")
    except ImageFileError:
        raise
    except UnidentifiedImageError:
        raise ImageFileError(f"{path}: not an image Pillow can read (garbage, or another "
                             "format under an image's extension)") from None
    except Image.DecompressionBombError as err:
        raise ImageFileError(f"{path}: {err}") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as err:
        reason = str(err) or type(err).__name__
        raise ImageFileError(f"{path}: cannot be decoded ({reason}); re-save or remove it") \
            from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def refuse(problems: list[str], folder: Path) -> None:
    """Raise one :class:`ImageFileError` naming every refused file (the first :data:`LISTED`)."""
    if not problems:
        return
    more = f"\n  ... and {len(problems) - LISTED} more" if len(problems) > LISTED else ""
    raise ImageFileError(f"imagefolder: {len(problems)} file(s) under {folder} cannot be used; "
                         "fix or remove them:\n  " + "\n  ".join(problems[:LISTED]) + more)


def read_image_folder(folder: Path, classes: tuple[str, ...], size: int) \
        -> tuple[Tensor, Tensor]:
    """All images under ``folder/<class>``: RGB, shorter side resized to ``size``,
    centre-cropped to ``size``×``size`` (torchvision's transforms); every file checked first
    (module docstring), each unusable one named in one :class:`ImageFileError`."""
    import torch

    from fedleak.harness.zoo.torchvision_compat import import_torchvision

    transforms = import_torchvision().transforms
    transform = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size),
                                    transforms.ToTensor()])
    found = folder_files(folder, classes)
    ceiling = max_image_pixels()
    say_skipped(found.skipped)
    images, labels, problems = [], [], []
    for path, label in found.files:
        try:
            image = open_image(path, ceiling)
        except ImageFileError as err:
            problems.append(str(err))
            continue
        images.append(transform(image))
        labels.append(label)
    refuse(problems, folder)
    return torch.stack(images), torch.as_tensor(labels, dtype=torch.int64)
