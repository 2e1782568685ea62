"""fedleak's cache folder: what is derived once per machine from installed packages.

``$FEDLEAK_CACHE``, else ``$XDG_CACHE_HOME/fedleak``, else ``~/.cache/fedleak``. It holds the
unpacked or dequantised pretrained text models (:mod:`fedleak.harness.zoo.text.pretrained`)
and the bundled image sets as arrays (:func:`cached_arrays`): every entry is keyed by the
versions of the packages it was derived from, written to a temporary file first and renamed,
so processes that build one at once never read half of it, and a damaged entry is built again.
Deleting the folder loses nothing but the time to rebuild.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np


def cache_root() -> Path:
    """The cache folder (module docstring)."""
    if os.environ.get("FEDLEAK_CACHE"):
        return Path(os.environ["FEDLEAK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedleak"


def cached_arrays(name: str, key: str, build: Callable[[], dict[str, np.ndarray]], *,
                  names: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays ``build()`` returns, read from ``datasets/<name>-<key>.npz`` in the cache
    when an intact entry holding exactly the arrays ``names`` is there, else built and stored.

    Parameters
    ----------
    name : str
        What the arrays are (a file-name stem: ``photos``).
    key : str
        Everything the arrays depend on besides ``name`` — the versions of the packages they
        are derived from and a format number — so a change of any gives a new entry.
    build : callable
        Computes the arrays (deterministic: the same ``key`` gives the same values).
    names : sequence of str
        The arrays ``build()`` returns; an entry holding others (another writer's file) is
        built again.

    Returns
    -------
    dict of str to numpy.ndarray
        The arrays, bit for bit what ``build()`` returned when the entry was written. Where
        the cache cannot be written (a read-only home) they are built and returned all the
        same.
    """
    path = cache_root() / "datasets" / f"{name}-{key}.npz"
    stored = _read(path)
    if stored is not None and set(stored) == set(names):
        return stored
    arrays = build()
    _write(path, arrays)
    return arrays


def _read(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {k: stored[k] for k in stored.files}
    except Exception:  # noqa: BLE001  (missing, truncated or damaged: built and replaced)
        return None


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".npz")
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]  # (numpy stubs: allow_pickle)
        os.replace(tmp, path)
        tmp = None
    except OSError:  # a read-only or full disk: the arrays are still returned
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
