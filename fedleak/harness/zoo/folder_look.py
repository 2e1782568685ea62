"""How a user's image folder is read: its resolution and its normalisation.

``--dataset imagefolder`` reads the user's own photographs. By default they are resized
(shorter side) and centre-cropped to 32×32 and normalised with ImageNet's mean and standard
deviation; ``--image-size 224`` keeps them at the user's resolution and ``--normalization
0.5/0.5`` states the normalisation its model was trained with. The data set's name carries
both (``imagefolder:size=224,mean=0.5;0.5;0.5,std=0.5;0.5;0.5``), so every process that
loads or describes it — the victim, ``Describe``, the attacker's prior — reads it the same.
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGEFOLDER_SIZE = 32
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class FolderLookError(ValueError):
    """A size or normalisation that cannot describe an image folder; says what to give."""


@dataclass(frozen=True)
class FolderLook:
    """How the user's image folder is read: ``size``×``size`` (resize of the shorter side,
    centre crop) and the per-channel normalisation its model was trained with."""

    size: int = IMAGEFOLDER_SIZE
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def name(self) -> str:
        """``imagefolder`` with what differs from the defaults, ``imagefolder:size=224,...``."""
        parts = []
        if self.size != IMAGEFOLDER_SIZE:
            parts.append(f"size={self.size}")
        if self.mean != IMAGENET_MEAN or self.std != IMAGENET_STD:
            parts.append("mean=" + ";".join(f"{m:g}" for m in self.mean))
            parts.append("std=" + ";".join(f"{v:g}" for v in self.std))
        return "imagefolder" + (":" + ",".join(parts) if parts else "")


def folder_look(name: str) -> tuple[str, FolderLook]:
    """``imagefolder:size=224,mean=0.5;0.5;0.5,std=0.5;0.5;0.5`` → (``imagefolder``, its
    :class:`FolderLook`); a name without options keeps the defaults."""
    base, _, rest = name.partition(":")
    if not rest:
        return name, FolderLook()
    if base != "imagefolder":
        raise FolderLookError(f"{name!r}: only imagefolder takes a size or normalisation "
                           "(--image-size, --normalization)")
    options = dict(item.partition("=")[::2] for item in rest.split(","))
    try:
        size = int(options.pop("size", IMAGEFOLDER_SIZE))
        mean = tuple(float(v) for v in options.pop("mean", "").split(";") if v) or IMAGENET_MEAN
        std = tuple(float(v) for v in options.pop("std", "").split(";") if v) or IMAGENET_STD
    except ValueError:
        raise FolderLookError(f"{name!r}: size is an integer, mean and std numbers") from None
    if options or size < 8 or len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise FolderLookError(f"{name!r}: imagefolder takes size=N (N >= 8) and mean/std of 3 "
                           "channels (std > 0), e.g. imagefolder:size=224")
    return base, FolderLook(size, mean, std)


def with_look(name: str, size: int | None, normalization: str | None) -> str:
    """The data set name carrying the CLI's ``--image-size`` and ``--normalization MEAN/STD``
    (each one number, or three comma-separated); unchanged when neither is given."""
    if size is None and normalization is None:
        return name
    if name != "imagefolder":
        raise FolderLookError(f"--image-size and --normalization apply to --dataset imagefolder "
                           f"(your own images), not {name!r}, whose look is fixed")
    look = FolderLook(size or IMAGEFOLDER_SIZE)
    if normalization is not None:
        mean_text, slash, std_text = normalization.partition("/")
        try:
            mean = [float(v) for v in mean_text.split(",")]
            std = [float(v) for v in std_text.split(",")] if slash else []
        except ValueError:
            mean = std = []
        if len(mean) not in (1, 3) or len(std) not in (1, 3) or min(std, default=0) <= 0:
            raise FolderLookError(f"--normalization {normalization!r}: give MEAN/STD, each one "
                               "number or three comma-separated (0.5/0.5, or "
                               "0.485,0.456,0.406/0.229,0.224,0.225)")
        look = FolderLook(look.size, tuple(mean * (3 // len(mean))),
                          tuple(std * (3 // len(std))))
    return look.name()
