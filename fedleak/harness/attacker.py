"""The honest-but-curious server: send θ, receive an update, reconstruct, score, write the run.

One *round* is: ``ComputeUpdate`` with the global parameters → an :class:`Observation` built
from what came back and what ``Describe`` published → the attack → ``Score`` (the victim
matches and scores the reconstruction; ground truth stays there) → ``Reveal`` when the victim
allows it and we hold its token, for the picture of ground truth beside reconstruction.

Everything a run produces goes under ``out``: ``metrics.json`` (scores, iterations, wall time,
config), and per round ``round-NNN/reconstruction.png``, ``reconstruction.npy`` (images on
[0, 1]) and ``comparison.png`` (truth above reconstruction, when revealed).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fedleak import __version__
from fedleak.attacks import Observation, Reconstruction, create_attack
from fedleak.attacks.dishonest import flip_labels
from fedleak.harness.client import VictimClient, VictimError
from fedleak.harness.datasets import DatasetInfo, denormalize
from fedleak.harness.models import ModelSpec, build_model, load_checkpoint
from fedleak.harness.pictures import save_grid
from fedleak.harness.protocol import Protocol, UpdateSimulator
from fedleak.harness.secagg_server_role import as_received_update, run_secure_aggregation
from fedleak.v1 import victim_pb2 as pb


@dataclass
class AttackSettings:
    """How the server attacks: which attack with which options, on which device, for how long."""

    attack: str = "inverting-gradients"
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    seed: int = 0
    rounds: int = 1
    checkpoint: str | None = None
    model_seed: int | None = None
    protocol: dict[str, Any] = field(default_factory=dict)
    flip_labels: tuple[int, int] | None = None
    secagg_target: str = "sum"
    show_progress: bool = True
    # Release threat model (kkt): the server's training request and the recovery threshold.
    release: dict[str, Any] = field(default_factory=dict)


def info_from_describe(described: pb.DescribeResponse) -> DatasetInfo:
    d = described.data
    return DatasetInfo(
        name=d.dataset,
        shape=tuple(d.shape),
        num_classes=d.num_classes,
        mean=tuple(d.mean),
        std=tuple(d.std),
        class_names=tuple(d.class_names),
    )


def server_model(described: pb.DescribeResponse) -> nn.Module:
    """The architecture the victim published, checked against its parameter list."""
    spec = ModelSpec(described.model.name, dict(described.model.options))
    info = info_from_describe(described)
    model = build_model(spec, info.shape, info.num_classes)
    ours = [(n, list(p.shape)) for n, p in model.named_parameters()]
    theirs = [(p.name, list(p.shape)) for p in described.parameters]
    if ours != theirs:
        raise VictimError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the victim's {spec} does not match this fedleak's build of it; "
            "run the same fedleak version on both sides",
        )
    return model


def global_parameters(
    client: VictimClient, described: pb.DescribeResponse, settings: AttackSettings
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """θ to send: a checkpoint of ours, a fresh seeded init, or the federation's global model."""
    if settings.checkpoint is None and settings.model_seed is None:
        return client.global_model()
    if settings.model_seed is not None:
        torch.manual_seed(settings.model_seed)
    model = server_model(described)
    if settings.checkpoint:
        load_checkpoint(model, settings.checkpoint)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


def observation_for(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    received: Any,
    info: DatasetInfo,
    device: str,
) -> Observation:
    """Package what the server holds after a round as the attack's threat model."""
    proto = received.protocol
    protocol = Protocol(proto.kind, proto.local_epochs, proto.batch_size, proto.learning_rate,
                        proto.batchnorm or "train")
    model = model.to(device)
    on_device = {n: t.to(device) for n, t in params.items()}
    simulator = UpdateSimulator(model, on_device, {n: b.to(device) for n, b in buffers.items()},
                                protocol)
    return Observation(
        parameter_names=list(params),
        parameters=list(simulator.parameters.values()),
        update=[u.to(device) for u in received.update],
        update_kind=received.update_kind,
        num_images=received.num_images,
        image_shape=info.shape,
        num_classes=info.num_classes,
        mean=info.mean,
        std=info.std,
        simulate=simulator,
        local_steps=received.local_steps,
        learning_rate=proto.learning_rate if proto.kind == "fedavg" else None,
        metadata=dict(received.metadata),
    )


def run_attack(
    client: VictimClient,
    settings: AttackSettings,
    out: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Attack ``settings.rounds`` rounds of the victim behind ``client``; write and return metrics.

    ``metrics.json`` is rewritten after every round, so an interrupted run keeps what it
    measured. Attacks on a released model (threat model "release", e.g. kkt) go through
    :func:`fedleak.harness.release_attacker.run_release_attack` instead.
    """
    from fedleak.attacks import attack_class

    if attack_class(settings.attack).threat_model == "release":
        from fedleak.harness.release_attacker import run_release_attack

        return run_release_attack(client, settings, out, log)
    out.mkdir(parents=True, exist_ok=True)
    described = client.describe()
    info = info_from_describe(described)
    model = server_model(described)
    params, buffers = global_parameters(client, described, settings)
    if settings.flip_labels is not None:
        params = flip_labels(params, info.num_classes, *settings.flip_labels)
    attack = create_attack(settings.attack, settings.options)
    request_protocol = pb.ProtocolSpec(**settings.protocol) if settings.protocol else None
    record: dict[str, Any] = {
        "fedleak_version": __version__,
        "victim": client.address,
        "victim_model": str(ModelSpec(described.model.name, dict(described.model.options))),
        "dataset": info.name,
        "attack": settings.attack,
        "attack_config": _jsonable(asdict(attack.config)),
        "settings": _jsonable(asdict(settings)),
        "device": settings.device,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "rounds": [],
    }
    secagg = any(d.name == "secagg" for d in described.defenses)
    for index in range(settings.rounds):
        if secagg:
            aggregation = run_secure_aggregation(client, params, buffers, request_protocol)
            received = as_received_update(aggregation, list(params),
                                          [tuple(t.shape) for t in params.values()],
                                          settings.secagg_target)
        else:
            received = client.compute_update(params, buffers, request_protocol)
        observation = observation_for(model, params, buffers, received, info, settings.device)
        started = time.perf_counter()
        reconstruction = _reconstruct(attack, observation, settings, index)
        wall = time.perf_counter() - started
        images = None
        if reconstruction.has_images:
            images = denormalize(reconstruction.images.detach().cpu(), info).clamp(0, 1)
        labels = [int(y) for y in reconstruction.labels.cpu().tolist()]
        for warning in reconstruction.warnings:
            log(f"warning: {warning}")
        features = reconstruction.features
        score = client.score(received.round_id, images, labels, received.user_ids,
                             features=None if features is None else features.detach().cpu(),
                             feature_layer=reconstruction.feature_layer)
        round_dir = out / f"round-{index:03d}"
        entry = _round_record(received, reconstruction, score, wall, round_dir, out)
        if images is not None:
            _save_pictures(client, described, received.round_id, images, score, round_dir,
                           entry, out, received.user_ids)
        record["rounds"].append(entry)
        record["summary"] = _summary(record["rounds"])
        (out / "metrics.json").write_text(json.dumps(record, indent=2))
        log(_round_line(index, score, wall))
    return record


def _reconstruct(
    attack: Any, observation: Observation, settings: AttackSettings, index: int
) -> Reconstruction:
    bar: tqdm | None = None

    def progress(i: int, total: int, objective: float) -> None:
        nonlocal bar
        if not settings.show_progress:
            return
        if bar is None:
            bar = tqdm(total=total, desc=f"round {index} {settings.attack}", unit="it",
                       leave=False, dynamic_ncols=True)
        bar.update(i - bar.n)
        bar.set_postfix(objective=f"{objective:.4f}")

    try:
        return attack.reconstruct(observation, device=settings.device,
                                  seed=settings.seed + index, progress=progress)
    finally:
        if bar is not None:
            bar.close()


def _round_record(
    received: Any,
    reconstruction: Reconstruction,
    score: pb.ScoreResponse,
    wall: float,
    round_dir: Path,
    out: Path,
) -> dict[str, Any]:
    round_dir.mkdir(parents=True, exist_ok=True)
    return {
        "round_id": received.round_id,
        "update_kind": received.update_kind,
        "num_images": received.num_images,
        "local_steps": received.local_steps,
        "victim_metadata": dict(received.metadata),
        "iterations": reconstruction.iterations,
        "objective": reconstruction.objective,
        "restart_objectives": reconstruction.restart_objectives,
        "wall_time_s": wall,
        "labels": [int(y) for y in reconstruction.labels.cpu().tolist()],
        "mean_psnr": score.mean_psnr if score.images else None,
        "mean_ssim": score.mean_ssim if score.images else None,
        "mean_mse": score.mean_mse if score.images else None,
        "label_accuracy": score.label_accuracy if score.labels_scored else None,
        "images": [
            {"index": s.index, "matched_index": s.matched_index, "psnr": s.psnr,
             "ssim": s.ssim, "mse": s.mse}
            for s in score.images
        ],
        "files": {},
        "warnings": list(reconstruction.warnings),
        **_feature_record(reconstruction, score, round_dir, out),
    }


def _feature_record(
    reconstruction: Reconstruction, score: pb.ScoreResponse, round_dir: Path, out: Path
) -> dict[str, Any]:
    """Recovered layer inputs: saved as ``features.npy``, with the victim's scores of them."""
    if reconstruction.features is None:
        return {}
    path = round_dir / "features.npy"
    np.save(path, reconstruction.features.detach().cpu().numpy())
    return {
        "feature_layer": reconstruction.feature_layer,
        "features_file": str(path.relative_to(out)),
        "mean_feature_cosine": score.mean_feature_cosine if score.features_scored else None,
        "mean_feature_relative_error": (score.mean_feature_relative_error
                                        if score.features_scored else None),
        "features": [
            {"index": f.index, "matched_index": f.matched_index, "cosine": f.cosine,
             "relative_error": f.relative_error}
            for f in score.features
        ],
    }


def _round_line(index: int, score: pb.ScoreResponse, wall: float) -> str:
    parts = []
    if score.images:
        parts.append(f"PSNR {score.mean_psnr:.2f} dB, SSIM {score.mean_ssim:.3f}")
    if score.features_scored:
        parts.append(f"features: cosine {score.mean_feature_cosine:.6f}, relative error "
                     f"{score.mean_feature_relative_error:.2e}")
    if score.labels_scored:
        parts.append(f"labels {score.label_accuracy:.0%}")
    return f"round {index}: " + ", ".join([*parts, f"{wall:.1f} s"])


def _save_pictures(
    client: VictimClient,
    described: pb.DescribeResponse,
    round_id: str,
    images: torch.Tensor,
    score: pb.ScoreResponse,
    round_dir: Path,
    entry: dict[str, Any],
    out: Path,
    user_ids: list[int] | None = None,
) -> None:
    np.save(round_dir / "reconstruction.npy", images.numpy())
    save_grid(round_dir / "reconstruction.png", images)
    entry["files"]["reconstruction"] = str((round_dir / "reconstruction.png").relative_to(out))
    if not (described.reveal_enabled and client.token):
        return
    try:
        truth, _ = client.reveal(round_id)
    except VictimError as err:
        entry["reveal_error"] = str(err)
        return
    if user_ids:  # secure aggregation: the truth of the users whose data was attacked
        per_user = truth.shape[0] // described.num_users
        truth = torch.cat([truth[u * per_user:(u + 1) * per_user] for u in sorted(user_ids)])
    matched = torch.stack([images[s.matched_index] for s in score.images])
    captions = [f"{s.psnr:.1f} dB" for s in score.images]
    path = save_grid(round_dir / "comparison.png", matched, truth, captions,
                     title=f"mean PSNR {score.mean_psnr:.2f} dB")
    entry["files"]["comparison"] = str(path.relative_to(out))


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    psnrs = [img["psnr"] for r in rounds for img in r["images"]]
    ssims = [img["ssim"] for r in rounds for img in r["images"]]
    accs = [r["label_accuracy"] for r in rounds if r["label_accuracy"] is not None]
    cosines = [r["mean_feature_cosine"] for r in rounds
               if r.get("mean_feature_cosine") is not None]
    summary = {
        "rounds": len(rounds),
        "images": len(psnrs),
        "mean_psnr": float(np.mean(psnrs)) if psnrs else None,
        "mean_ssim": float(np.mean(ssims)) if ssims else None,
        "label_accuracy": float(np.mean(accs)) if accs else None,
        "wall_time_s": float(sum(r["wall_time_s"] for r in rounds)),
    }
    if cosines:
        summary["mean_feature_cosine"] = float(np.mean(cosines))
        summary["mean_feature_relative_error"] = float(np.mean(
            [r["mean_feature_relative_error"] for r in rounds
             if r.get("mean_feature_relative_error") is not None]))
    return summary


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
