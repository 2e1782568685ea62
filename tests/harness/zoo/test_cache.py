"""The cache folder: bundled image sets derived once, read back bit for bit, rebuilt when
damaged, and still served where the cache cannot be written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedleak.harness.zoo import bundled_images
from fedleak.harness.zoo.cache import cache_root, cached_arrays


def test_the_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("FEDLEAK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "fedleak"


def test_arrays_are_built_once_then_read_and_a_damaged_entry_is_rebuilt(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))
    calls = []

    def build() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "y": np.array([3, 1])}

    first = cached_arrays("toy", "k1", build, names="xy")
    again = cached_arrays("toy", "k1", build, names="xy")
    assert len(calls) == 1 and again.keys() == first.keys()
    assert all(np.array_equal(first[k], again[k]) and first[k].dtype == again[k].dtype
               for k in first)
    (entry,) = (tmp_path / "datasets").glob("toy-k1.npz")
    entry.write_bytes(entry.read_bytes()[:40])  # truncated by a crash or a full disk
    rebuilt = cached_arrays("toy", "k1", build, names="xy")
    assert len(calls) == 2 and np.array_equal(rebuilt["x"], first["x"])
    assert np.array_equal(cached_arrays("toy", "k1", build, names="xy")["y"], first["y"])
    assert len(calls) == 2
    cached_arrays("toy", "k2", build, names="xy")  # another key: another entry
    assert len(calls) == 3 and not list((tmp_path / "datasets").glob(".*"))  # no temp left
    np.savez(tmp_path / "datasets" / "toy-k2.npz", z=np.zeros(2))  # another writer's arrays
    assert set(cached_arrays("toy", "k2", build, names="xy")) == {"x", "y"} and len(calls) == 4


def test_an_unwritable_cache_still_returns_the_arrays(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("FEDLEAK_CACHE", str(blocked))
    out = cached_arrays("toy", "k", lambda: {"x": np.ones(3)}, names="x")
    assert np.array_equal(out["x"], np.ones(3))


def test_cached_photos_and_digits_equal_the_freshly_computed_ones(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))
    crops = [bundled_images.centred_square(bundled_images.read_photo(name), fraction)
             for name in bundled_images.PHOTO_NAMES
             for fraction in bundled_images.PHOTO_CROP_FRACTIONS]
    fresh = torch.as_tensor(np.stack(crops), dtype=torch.float32).permute(0, 3, 1, 2)
    digits = load_digits()
    for _ in range(2):  # built into the empty cache, then read from it
        bundled_images.read_photos.cache_clear()
        bundled_images.read_digits.cache_clear()
        images, labels = bundled_images.read_photos()
        assert torch.equal(images, fresh) and images.is_contiguous()
        assert labels.tolist() == [i // 2 for i in range(20)] and labels.dtype == torch.int64
        d_images, d_labels = bundled_images.read_digits()
        assert d_images.shape == (1797, 1, 8, 8) and d_images.dtype == torch.float32
        assert torch.equal(d_images, torch.as_tensor(digits.images / 16.0,
                                                     dtype=torch.float32).unsqueeze(1))
        assert torch.equal(d_labels, torch.as_tensor(digits.target, dtype=torch.int64))
    assert len(list((tmp_path / "datasets").glob("*.npz"))) == 2
    bundled_images.read_photos.cache_clear()
    bundled_images.read_digits.cache_clear()
