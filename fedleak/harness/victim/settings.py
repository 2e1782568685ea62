"""Everything that defines a victim, as one typed object, and the victim it builds.

:class:`VictimSettings` is what ``fedleak victim serve`` turns its options into (in one place,
the CLI), what a sweep builds for each point, and what travels to a child victim process as a
JSON file (``fedleak victim serve --settings FILE``), so a victim is never described by argv
rebuilt from typed values. :func:`create_victim` loads the private pool, builds the model
(seeded init or checkpoint) and the defense chain, and returns the :class:`Victim`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import secrets
import tomllib
from dataclasses import dataclass, field
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
from fedleak.harness.federated.local_update import set_training_mode
from fedleak.harness.federated.protocol import FEDSGD, Protocol, local_batches
from fedleak.harness.victim.audit.informed_game import GameSettings, InformedGame, prior_split
from fedleak.harness.victim.config import VictimConfig
from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.release.releaser import ReleaseSettings
from fedleak.harness.victim.secagg_session import parse_drops
from fedleak.harness.victim.selection import private_pool
from fedleak.harness.victim.text_pool import is_text_dataset, load_text_pool
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import OPACUS_OPTION, ModelSpec, build_model, load_checkpoint
from fedleak.harness.zoo.text.text_datasets import TextDataset
from fedleak.harness.zoo.text.text_models import build_text_model


class SetupError(ValueError):
    """Settings that cannot build a victim; the message says which option to change."""


@dataclass(frozen=True)
class VictimSettings:
    """A federated user: its private data, model, protocol, defenses and release budget.

    ``defenses`` are ``name:key=value,...`` specs applied after the tables of
    ``defense_file``; ``secagg_drops`` are ``USER@PHASE`` specs; ``release.seed`` is always the
    victim's ``seed``; ``limits`` cap what a server may ask and how often a round is scored.
    """

    dataset: str = "photos"
    model: str = "lenet-zhu"
    split: str = "train"
    images: str | None = None
    shuffle: bool = False
    data_root: str | None = None
    download: bool = False
    checkpoint: str | None = None
    batch_size: int = 1
    seed: int = 0
    protocol: Protocol = field(default_factory=Protocol)
    reveal: bool = False
    device: str = "cpu"
    defenses: tuple[str, ...] = ()
    defense_file: str | None = None
    defense_seed: int | None = None
    users: int = 1
    secagg_drops: tuple[str, ...] = ()
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    limits: VictimLimits = field(default_factory=VictimLimits)
    #: when updates carry the buffers local training left: never, fedavg, always
    buffers: str = "fedavg"
    #: the informed-adversary game: N public candidates per trial (0: no game), m known records
    informed_candidates: int = 0
    informed_known: int = 0
    #: whether the victim plays the audit game (``--allow-audit``; docs/audit.md)
    audit: bool = False
    #: text data sets: tokens per sequence, the tokenizer (None: bundled) and canaries
    seq_len: int = 32
    tokenizer: str | None = None
    canaries: int = 0

    def to_json(self) -> str:
        """The settings as JSON (what ``--settings FILE`` reads)."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VictimSettings:
        """Settings from :meth:`to_json`'s output; unknown keys are refused by name."""
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as err:
            raise SetupError(f"victim settings are not valid JSON: {err}") from None
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise SetupError(f"unknown victim setting(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(valid))}")
        try:
            data["protocol"] = Protocol(**data.get("protocol", {}))
            data["release"] = ReleaseSettings(**data.get("release", {}))
            data["limits"] = VictimLimits(**data.get("limits", {}))
            for key in ("defenses", "secagg_drops"):
                data[key] = tuple(data.get(key, ()))
            return cls(**data)
        except TypeError as err:
            raise SetupError(f"victim settings: {err}") from None

    @classmethod
    def load(cls, path: str | Path) -> VictimSettings:
        try:
            return cls.from_json(Path(path).read_text())
        except OSError as err:
            raise SetupError(f"cannot read victim settings {path}: {err}") from None


def load_defense_file(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[defense]]`` tables of the TOML file at ``path`` as (name, params) pairs."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DefenseConfigError(f"cannot read defense file {path}: {err}") from err
    return defense_tables(data, str(path))


def defense_chain(settings: VictimSettings) -> DefenseChain:
    """The chain of ``settings``: the defense file's tables first, then the specs."""
    pairs = load_defense_file(settings.defense_file) if settings.defense_file else []
    pairs += [parse_defense_spec(s) for s in settings.defenses]
    return build_chain(pairs)


def create_victim(settings: VictimSettings, chain: DefenseChain | None = None) -> Victim:
    """Load the private pool, build the model (seeded init or checkpoint) and the victim.

    ``chain`` is the already-built defense chain of ``settings`` (built here when None).
    """
    s = settings
    text = is_text_dataset(s.dataset)
    if text and s.informed_candidates:
        raise SetupError("the informed-adversary game draws image candidates; text victims "
                         "do not play it (drop --informed-candidates)")
    raw = load_text_pool(s) if text else load_dataset(s.dataset, s.split, s.data_root,
                                                      s.download)
    data = private_pool(raw, s.images, s.shuffle, s.seed)
    if s.batch_size * s.users > len(data.labels):
        raise SetupError(f"{s.users} user(s) × --batch-size {s.batch_size} exceed the "
                         f"{len(data.labels)} private images; lower them or select more with "
                         "--images")
    spec = ModelSpec.parse(s.model)
    chain = chain if chain is not None else defense_chain(s)
    if chain.per_example is not None:  # per-example gradients need Opacus-compatible layers
        spec = ModelSpec(spec.name, {**spec.options, OPACUS_OPTION: "true"})
    torch.manual_seed(s.seed)
    net: torch.nn.Module
    if isinstance(data, TextDataset):
        net = build_text_model(spec, data.info)
    else:
        net = build_model(spec, data.info.shape, data.info.num_classes)
    if s.checkpoint is not None:
        load_checkpoint(net, str(s.checkpoint))
    if not isinstance(data, TextDataset):
        check_trainable(net, s.protocol, normalize(data.images[:s.batch_size], data.info),
                        f"{s.model} on {s.dataset}")
    config = VictimConfig(
        model=spec,
        protocol=s.protocol,
        num_images=s.batch_size,
        reveal_enabled=s.reveal,
        device=s.device,
        defenses=chain,
        num_users=s.users,
        secagg_drops=parse_drops(s.secagg_drops),
        release=dataclasses.replace(s.release, seed=s.seed),
        limits=s.limits,
        split=s.split,
        buffers_returned=s.buffers,
        audit_enabled=s.audit,
    )
    generator = None if s.defense_seed is None else torch.Generator().manual_seed(s.defense_seed)
    return Victim(config, data, net, generator, informed_game(s))


def check_trainable(model: torch.nn.Module, protocol: Protocol, images: torch.Tensor,
                    what: str) -> None:
    """SetupError unless ``model`` runs forward the way its user will train it: in training
    mode with BatchNorm as ``protocol.batchnorm`` says, on each local batch size one round of
    ``images`` ``[n, C, H, W]`` makes (FedSGD: n; FedAvg: B and the last batch's n mod B).

    BatchNorm in training mode normalises each channel over the N·H·W values of a batch; where
    that is one value (a batch of one image whose feature map has shrunk to 1×1, e.g. ResNet-18
    at 32×32) torch refuses, and every round would fail. A copy of the model is run, so the
    victim's own BatchNorm statistics are not moved."""
    if protocol.batchnorm != "train" or not any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return
    probe = copy.deepcopy(model)
    set_training_mode(probe, protocol)
    n = images.shape[0]
    sizes = sorted({b.stop - b.start for b in local_batches(n, protocol.batch_size)}) \
        if protocol.kind != FEDSGD else [n]
    for size in sizes:
        try:
            with torch.no_grad():
                probe(images[:size])
        except ValueError as err:
            local = " (or --local-batch-size)" if protocol.kind != FEDSGD else ""
            raise SetupError(
                f"{what} cannot train as this victim would: BatchNorm in training mode on a "
                f"local batch of {size} image(s) of {'×'.join(map(str, images.shape[1:]))} "
                f"fails ({err}); start the victim with --batchnorm eval (BatchNorm on its "
                f"running statistics), a larger --batch-size{local}, or larger images "
                "(--image-size with --dataset imagefolder)") from None


def informed_game(s: VictimSettings) -> InformedGame | None:
    """The informed-adversary game of ``s``, drawing from the public prior (the other split);
    its coins are secret unless ``defense_seed`` fixes them."""
    try:
        game = GameSettings(s.informed_candidates, s.informed_known)
        if not game.enabled:
            return None
        split = prior_split(s.split)
        prior = load_dataset(s.dataset, split, s.data_root, s.download)
        seed = secrets.randbits(63) if s.defense_seed is None else s.defense_seed + 1
        return InformedGame(prior, game, torch.Generator().manual_seed(seed), split)
    except ValueError as err:
        raise SetupError(str(err)) from None
