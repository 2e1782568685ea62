"""Pictures a person looks at: reconstructions, and ground truth beside them when revealed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

#: above this many images a grid is drawn as one tiled picture (no per-image axes: 600 axes
#: take matplotlib seconds, and their captions could not be read anyway)
TILED_ABOVE = 64
#: the resolution pictures are saved at
DPI = 120


def _show(ax: plt.Axes, image: torch.Tensor) -> None:
    array = image.detach().cpu().clamp(0, 1).permute(1, 2, 0).numpy()
    if array.shape[2] == 1:
        ax.imshow(array[:, :, 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    else:
        ax.imshow(array, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def save_grid(
    path: Path,
    reconstruction: torch.Tensor,
    truth: torch.Tensor | None = None,
    captions: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Save images on [0, 1] as a grid: ground truth on top (if given), reconstruction below.

    ``truth`` and ``reconstruction`` must already be in matched order; ``captions`` label the
    reconstruction row (e.g. per-image PSNR). Every image is drawn at its own resolution or
    larger (a 224×224 reconstruction keeps its 224×224 pixels: the figure grows until each
    image's axes hold them). Above :data:`TILED_ABOVE` images the grid is one tiled picture at
    the images' resolution, without captions or title.
    """
    n = reconstruction.shape[0]
    if n > TILED_ABOVE:
        return _save_tiled(path, reconstruction, truth)
    rows = 2 if truth is not None else 1
    cols = min(n, 10)
    blocks = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows * blocks, cols, figsize=(1.6 * cols, 1.8 * rows * blocks),
                             squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        block, col = divmod(i, cols)
        if truth is not None:
            ax = axes[block * rows, col]
            ax.axis("on")
            _show(ax, truth[i])
            if col == 0:
                ax.set_ylabel("truth", fontsize=8)
        ax = axes[block * rows + rows - 1, col]
        ax.axis("on")
        _show(ax, reconstruction[i])
        if col == 0:
            ax.set_ylabel("reconstruction", fontsize=8)
        if captions is not None:
            ax.set_xlabel(captions[i], fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    _at_native_size(fig, [ax for ax in axes.flat if ax.images], reconstruction.shape[-2:])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _at_native_size(fig: plt.Figure, axes: list[plt.Axes], size: Sequence[int]) -> None:
    """Grow ``fig`` until every one of ``axes`` holds at least ``size`` (H, W) pixels at
    :data:`DPI` (the axes keep the images' aspect, and the labels' margins stay in inches)."""
    height, width = int(size[0]), int(size[1])
    for _ in range(4):
        fig.set_dpi(DPI)
        boxes = [ax.get_window_extent() for ax in axes]
        short = max([max(width / max(b.width, 1.0), height / max(b.height, 1.0))
                     for b in boxes] or [1.0])
        if short <= 1.0:
            return
        w, h = fig.get_size_inches()
        fig.set_size_inches(w * short * 1.02, h * short * 1.02)
        fig.tight_layout()


def _save_tiled(path: Path, reconstruction: torch.Tensor, truth: torch.Tensor | None,
                cols: int = 20, gap: int = 2) -> Path:
    """Many images as one picture: rows of ``cols`` images (a truth row above each
    reconstruction row when ``truth`` is given), ``gap`` white pixels between them."""
    n, channels, height, width = reconstruction.shape
    sources = [reconstruction] if truth is None else [truth, reconstruction]
    blocks = (n + cols - 1) // cols
    rows = blocks * len(sources)
    canvas = np.ones((rows * (height + gap) + gap, cols * (width + gap) + gap, 3),
                     dtype=np.float32)
    for block in range(blocks):
        for s, source in enumerate(sources):
            top = (block * len(sources) + s) * (height + gap) + gap
            for col in range(min(cols, n - block * cols)):
                image = source[block * cols + col].detach().cpu().clamp(0, 1)
                tile = image.expand(3, height, width) if channels == 1 else image[:3]
                left = col * (width + gap) + gap
                canvas[top:top + height, left:left + width] = tile.permute(1, 2, 0).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, canvas)
    return path


def save_reconstruction(folder: Path, images: torch.Tensor) -> Path:
    """A reconstruction's files in ``folder``: ``reconstruction.npy`` (images on [0, 1]) and
    ``reconstruction.png`` (their grid); returns the picture's path."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "reconstruction.npy", images.numpy())
    return save_grid(folder / "reconstruction.png", images)
