"""Reconstruction pictures: a grid per image for small batches, one tiled picture for large
ones (drawing hundreds of matplotlib axes takes seconds), and the files a reconstruction
leaves."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np
import torch

from fedleak.harness.attacker.pictures import TILED_ABOVE, save_grid, save_reconstruction


def test_a_large_batch_is_one_tiled_picture_of_every_image(tmp_path: Path) -> None:
    n, cols, gap = TILED_ABOVE + 21, 20, 2
    images = torch.rand(n, 3, 8, 6)
    truth = torch.rand(n, 3, 8, 6)
    picture = matplotlib.image.imread(save_grid(tmp_path / "grid.png", images, truth))
    blocks = (n + cols - 1) // cols
    assert picture.shape[:2] == (2 * blocks * (8 + gap) + gap, cols * (6 + gap) + gap)
    # block 0: truth row then reconstruction row; the last image sits in the last block
    top, left = gap, gap
    assert np.allclose(picture[top:top + 8, left:left + 6, :3],
                       truth[0].permute(1, 2, 0).numpy(), atol=1 / 255)
    top = (2 * (blocks - 1) + 1) * (8 + gap) + gap
    left = ((n - 1) % cols) * (6 + gap) + gap
    assert np.allclose(picture[top:top + 8, left:left + 6, :3],
                       images[n - 1].permute(1, 2, 0).numpy(), atol=1 / 255)


def test_grey_images_tile_as_grey_and_small_batches_keep_their_axes(tmp_path: Path) -> None:
    grey = torch.rand(TILED_ABOVE + 1, 1, 4, 4)
    picture = matplotlib.image.imread(save_grid(tmp_path / "grey.png", grey))
    assert np.allclose(picture[2:6, 2:6, 0], grey[0, 0].numpy(), atol=1 / 255)
    assert np.allclose(picture[2:6, 2:6, 0], picture[2:6, 2:6, 2])
    small = matplotlib.image.imread(save_grid(tmp_path / "small.png", torch.rand(3, 3, 4, 4),
                                              captions=["a", "b", "c"]))
    assert small.shape[0] > 100  # a matplotlib figure, not 4-pixel tiles


def test_a_reconstruction_leaves_its_array_and_its_picture(tmp_path: Path) -> None:
    images = torch.rand(2, 1, 5, 5)
    picture = save_reconstruction(tmp_path / "round-001", images)
    assert picture == tmp_path / "round-001" / "reconstruction.png" and picture.is_file()
    assert np.array_equal(np.load(tmp_path / "round-001" / "reconstruction.npy"),
                          images.numpy())


def test_an_image_at_224_pixels_is_saved_with_its_224_pixels(tmp_path: Path) -> None:
    """A ResNet-18-sized reconstruction keeps its resolution in the grid (not a 192-pixel
    thumbnail): drawn pure red on white, it covers at least 224 x 224 pixels of the picture,
    beside its truth and caption too."""
    red = torch.zeros(1, 3, 224, 224)
    red[:, 0] = 1.0
    for truth in (None, torch.zeros(1, 3, 224, 224)):
        picture = matplotlib.image.imread(save_grid(tmp_path / "big.png", red, truth,
                                                    captions=["10.0 dB"], title="t"))
        redness = (picture[..., 0] > 0.9) & (picture[..., 1] < 0.1) & (picture[..., 2] < 0.1)
        rows, cols = np.nonzero(redness)
        assert rows.max() - rows.min() + 1 >= 224 and cols.max() - cols.min() + 1 >= 224
