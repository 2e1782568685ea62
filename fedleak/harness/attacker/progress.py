"""A progress bar over an attack's iterations, fed by the attack's ``progress`` callback."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from fedleak.attacks import Attack, Reconstruction


def reconstruct_with_progress(
    attack: Attack, target: Any, *, device: str, seed: int, label: str, show: bool = True
) -> Reconstruction:
    """``attack.reconstruct(target)`` with a tqdm bar named ``label`` (none when not ``show``).

    ``target`` is what the attack's threat model gives the server: an ``Observation`` of one
    round or a ``ReleasedModel``.
    """
    bar: tqdm | None = None

    def progress(i: int, total: int, objective: float) -> None:
        nonlocal bar
        if not show:
            return
        if bar is None:
            bar = tqdm(total=total, desc=label, unit="it", leave=False, dynamic_ncols=True)
        bar.update(i - bar.n)
        bar.set_postfix(objective=f"{objective:.4f}")

    try:
        return attack.reconstruct(target, device=device, seed=seed, progress=progress)
    finally:
        if bar is not None:
            bar.close()
