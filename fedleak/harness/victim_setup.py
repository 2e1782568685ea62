"""Build a :class:`Victim` from the options a person gives ``fedleak victim serve``."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedleak.defenses import (
    DefenseChain,
    DefenseConfigError,
    build_chain,
    defense_tables,
    parse_defense_spec,
)
from fedleak.harness.datasets import ImageDataset, load_dataset
from fedleak.harness.models import OPACUS_OPTION, ModelSpec, build_model, load_checkpoint
from fedleak.harness.protocol import Protocol
from fedleak.harness.release_victim import ReleaseSettings
from fedleak.harness.victim import Victim, VictimConfig


class SetupError(ValueError):
    """Options that cannot build a victim; the message says which option to change."""


def parse_indices(text: str, count: int) -> list[int]:
    """Parse ``0-3,7`` into ``[0, 1, 2, 3, 7]``, each within ``[0, count)``."""
    indices: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise SetupError(f"--images {text!r}: {part!r} is not an index or a range a-b") \
                from None
        if not 0 <= lo <= hi < count:
            raise SetupError(f"--images {text!r}: {part!r} is outside 0-{count - 1} "
                             f"({count} images in this split)")
        indices.extend(range(lo, hi + 1))
    if not indices:
        raise SetupError(f"--images {text!r} selects no image")
    return indices


def private_pool(
    data: ImageDataset, images: str | None, shuffle: bool, seed: int
) -> ImageDataset:
    """The victim's private images: a selection of the split, optionally shuffled by ``seed``."""
    order = torch.arange(len(data.labels))
    if images:
        order = torch.tensor(parse_indices(images, len(data.labels)))
    if shuffle:
        generator = torch.Generator().manual_seed(seed)
        order = order[torch.randperm(len(order), generator=generator)]
    return ImageDataset(images=data.images[order], labels=data.labels[order], info=data.info)


def load_defense_file(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[defense]]`` tables of the TOML file at ``path`` as (name, params) pairs."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DefenseConfigError(f"cannot read defense file {path}: {err}") from err
    return defense_tables(data, str(path))


def parse_defenses(specs: tuple[str, ...] | list[str], toml_file: str | None) -> DefenseChain:
    """``--defense`` specs and an optional ``--defense-file`` as one chain (file first)."""
    pairs = load_defense_file(toml_file) if toml_file else []
    pairs += [parse_defense_spec(s) for s in specs]
    return build_chain(pairs)


def create_victim(
    dataset: str,
    model: str,
    *,
    split: str = "train",
    images: str | None = None,
    shuffle: bool = False,
    data_root: str | None = None,
    download: bool = False,
    checkpoint: str | Path | None = None,
    batch_size: int = 1,
    seed: int = 0,
    protocol: Protocol | None = None,
    reveal: bool = False,
    device: str = "cpu",
    defenses: DefenseChain | None = None,
    defense_seed: int | None = None,
    users: int = 1,
    secagg_drops: dict[int, str] | None = None,
    release: ReleaseSettings | None = None,
) -> Victim:
    """Load the private pool, build the model (seeded init or checkpoint) and the victim."""
    data = private_pool(load_dataset(dataset, split, data_root, download), images, shuffle, seed)
    if batch_size * users > len(data.labels):
        raise SetupError(f"{users} user(s) × --batch-size {batch_size} exceed the "
                         f"{len(data.labels)} private images; lower them or select more with "
                         "--images")
    spec = ModelSpec.parse(model)
    chain = defenses or DefenseChain()
    if chain.per_example is not None:  # per-example gradients need Opacus-compatible layers
        spec = ModelSpec(spec.name, {**spec.options, OPACUS_OPTION: "true"})
    torch.manual_seed(seed)
    net = build_model(spec, data.info.shape, data.info.num_classes)
    if checkpoint is not None:
        load_checkpoint(net, str(checkpoint))
    config = VictimConfig(
        model=spec,
        protocol=protocol or Protocol(),
        num_images=batch_size,
        reveal_enabled=reveal,
        device=device,
        defenses=chain,
        num_users=users,
        secagg_drops=dict(secagg_drops or {}),
        release=replace(release or ReleaseSettings(), seed=seed),
    )
    generator = None if defense_seed is None else torch.Generator().manual_seed(defense_seed)
    return Victim(config, data, net, generator)
