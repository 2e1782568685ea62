"""Pictures a person looks at: reconstructions, and ground truth beside them when revealed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


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
    reconstruction row (e.g. per-image PSNR).
    """
    n = reconstruction.shape[0]
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
