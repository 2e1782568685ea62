"""A progress bar over an attack's iterations, fed by the attack's ``progress`` callback."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from fedleak.attacks import Attack, Reconstruction


class IterationBar:
    """A tqdm bar fed by an attack's ``progress(i, total, objective)`` (nothing when hidden)."""

    def __init__(self, label: str, show: bool = True) -> None:
        self.label = label
        self.show = show
        self.bar: tqdm | None = None

    def __call__(self, i: int, total: int, objective: float) -> None:
        if not self.show:
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, unit="it", leave=False,
                            dynamic_ncols=True)
        self.bar.update(i - self.bar.n)
        self.bar.set_postfix(objective=f"{objective:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def reconstruct_with_progress(
    attack: Attack, target: Any, *, device: str, seed: int, label: str, show: bool = True
) -> Reconstruction:
    """``attack.reconstruct(target)`` with a tqdm bar named ``label`` (none when not ``show``).

    ``target`` is what the attack's threat model gives the server: an ``Observation`` of one
    round or a ``ReleasedModel``.
    """
    bar = IterationBar(label, show)
    try:
        return attack.reconstruct(target, device=device, seed=seed, progress=bar)
    finally:
        bar.close()


def reconstruct_many_with_progress(
    attack: Attack, targets: list[Any], *, device: str, seeds: list[int], label: str,
    show: bool = True,
) -> list[Reconstruction]:
    """``attack.reconstruct_many(targets)`` (packed where the attack can) with one bar;
    target i seeded ``seeds[i]``."""
    bar = IterationBar(label, show)
    try:
        return attack.reconstruct_many(targets, device=device, seeds=seeds, progress=bar)
    finally:
        bar.close()
