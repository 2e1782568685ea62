"""Recorded rounds: what a server received, kept on disk to be attacked later.

A heavy attack must not block a federation's round, so an audit may only *record* each node's
round — the θ it sent (parameters and buffers), the update it read off the reply, and the
public facts (protocol, n, update kind, local steps, the node's metadata) — and
``fedleak attack --from-recording DIR`` attacks them afterwards with the same code
(:func:`~fedleak.harness.federated.observe.observation_from_update`, the victim's replay).

Layout: ``DIR/recording.json`` (model spec, data set, and one entry per recorded round) and,
per round, ``DIR/<entry>/arrays.npz`` holding ``param/<name>``, ``buffer/<name>`` and
``update/<name>`` (plain arrays, loaded without pickle). Ground truth is never recorded: it
stays on the nodes, so a recording's reconstructions are written unscored.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.published import published
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.attack_settings import jsonable
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.pictures import save_reconstruction
from fedleak.harness.attacker.records import RunHeader, UpdateRun, write_json
from fedleak.harness.attacker.round_outcome import round_record
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.zoo.datasets import dataset_info, denormalize
from fedleak.harness.zoo.models import build_model

INDEX_NAME = "recording.json"
ARRAYS_NAME = "arrays.npz"


class RecordingError(ValueError):
    """A folder that is not a readable recording; the message says what is wrong."""


@dataclass
class RecordedRound:
    """One node's round as the server received it."""

    folder: str
    round_id: str
    protocol: dict[str, Any]
    update_kind: str
    num_images: int
    local_steps: int
    metadata: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    #: the defense chain the reply published, [{name, params, stage}] in order
    defenses: list[dict[str, Any]] = field(default_factory=list)
    #: why the recorder knew a replay of this round is not the update (beside the protocol)
    inexact: list[str] = field(default_factory=list)


def write_round(out: Path, folder: str, received: ReceivedUpdate,
                params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
                warnings: list[str], model: str, dataset: str,
                inexact: list[str] | None = None) -> None:
    """Add ``received`` (with the θ it answers) to the recording in ``out``."""
    (out / folder).mkdir(parents=True, exist_ok=True)
    arrays = {f"param/{k}": v.detach().cpu().numpy() for k, v in params.items()}
    arrays.update({f"buffer/{k}": v.detach().cpu().numpy() for k, v in buffers.items()})
    arrays.update({f"update/{k}": u.detach().cpu().numpy()
                   for k, u in zip(received.names, received.update, strict=True)})
    np.savez(out / folder / ARRAYS_NAME, **arrays)  # type: ignore[arg-type]
    index: dict[str, Any] = _read_index(out) if (out / INDEX_NAME).exists() else \
        {"model": model, "dataset": dataset, "rounds": []}
    index["rounds"].append(dataclasses.asdict(RecordedRound(
        folder, received.round_id, received.protocol.options() | {"batchnorm":
                                                                  received.protocol.batchnorm},
        received.update_kind, received.num_images, received.local_steps,
        dict(received.metadata), list(warnings),
        [{"name": d.name, "params": dict(d.params), "stage": d.stage}
         for d in received.defenses or ()], list(inexact or []))))
    write_json(out / INDEX_NAME, index)


def attack_recording(recording: Path, attack_name: str, options: Mapping[str, Any], out: Path,
                     *, seed: int = 0, device: str = "cpu", show_progress: bool = True,
                     log: Callable[[str], None] = print) -> UpdateRun:
    """Attack every round of ``recording``; write the run (unscored) to ``out``."""
    index = _read_index(recording)
    info = dataset_info(index["dataset"])
    model = build_model(index["model"], info.shape, info.num_classes).to(device)
    attack = create_attack(attack_name, dict(options))
    run = UpdateRun(RunHeader.now(
        f"recording {recording}", index["model"], info.name, attack_name,
        jsonable(dataclasses.asdict(attack.config)),
        {"from_recording": str(recording), "seed": seed, "options": jsonable(dict(options))},
        device))
    out.mkdir(parents=True, exist_ok=True)
    run.write(out)
    for number, entry in enumerate(index["rounds"]):
        got = RecordedRound(**entry)
        received, params, buffers = _load_round(recording, got)
        observation = observation_for(model, params, buffers, received, info, device)
        started = time.perf_counter()
        reconstruction = reconstruct_with_progress(
            attack, observation, device=device, seed=seed + number,
            label=f"{got.round_id} {attack_name}", show=show_progress)
        record = round_record(received, reconstruction, None,
                              time.perf_counter() - started)
        record.warnings += got.warnings
        record.defenses = [d.spec() for d in received.defenses or ()] or None
        if got.inexact:
            record.replay = "inexact"
            record.inexact_reasons = [*got.inexact, *(record.inexact_reasons or [])]
        record.unscored = "attacked from a recording: the ground truth stayed on the node"
        if reconstruction.has_images:
            images = denormalize(reconstruction.images.detach().cpu(), info).clamp(0, 1)
            save_reconstruction(out / got.folder, images)
            record.files["reconstruction"] = f"{got.folder}/reconstruction.png"
        run.rounds.append(record)
        run.write(out)
        log(f"{got.round_id}: attacked ({record.iterations} iterations, "
            f"{record.wall_time_s:.1f} s), unscored")
    run.status = "finished"
    run.write(out)
    return run


def _read_index(recording: Path) -> dict[str, Any]:
    path = recording / INDEX_NAME
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(f"{recording} holds no {INDEX_NAME}: give the folder a "
                             "LeakageAudit(record_only=True) wrote") from None
    except json.JSONDecodeError as err:
        raise RecordingError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(index, dict) or not {"model", "dataset", "rounds"} <= set(index):
        raise RecordingError(f"{path} lacks model, dataset or rounds")
    return index


def _load_round(recording: Path, got: RecordedRound
                ) -> tuple[ReceivedUpdate, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    try:
        with np.load(recording / got.folder / ARRAYS_NAME, allow_pickle=False) as arrays:
            loaded = {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}
    except (OSError, ValueError) as err:
        raise RecordingError(f"{recording / got.folder / ARRAYS_NAME}: {err}") from None

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: v for k, v in loaded.items() if k.startswith(prefix)}

    params, buffers, update = part("param/"), part("buffer/"), part("update/")
    if list(update) != list(params):
        raise RecordingError(f"{got.folder}: the update's arrays do not match θ's parameters")
    received = ReceivedUpdate(
        round_id=got.round_id, names=list(params), update=list(update.values()),
        update_kind=got.update_kind, protocol=Protocol.from_options(got.protocol),
        num_images=got.num_images, local_steps=got.local_steps, metadata=dict(got.metadata),
        defenses=published((d["name"], d.get("params", {}), d["stage"]) for d in got.defenses))
    return received, params, buffers

