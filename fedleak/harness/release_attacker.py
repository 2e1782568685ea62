"""The server's side of the release threat model: ask for the release, attack it, score, write.

One run (``fedleak attack --attack kkt``):

1. ``Describe`` → the architecture Φ (``kkt-mlp`` of the victim's spec), checked against the
   victim's parameter list.
2. ``Release`` (server-streaming, tqdm bar over the victim's epochs) → θ, n, input box, ε.
3. The attack (e.g. :class:`fedleak.attacks.kkt.KKT`) on the :class:`ReleasedModel`, with a bar
   over its iterations → m candidates per run, pooled over the random search.
4. Each candidate scaled to [0, 1] on its own (App. B.3 step 1), non-finite ones dropped, and
   ``Score`` with the release id: the victim matches them to its training set (NCC nearest
   neighbours and voting, SSIM per training sample) and returns each sample's margin
   y_i Φ(θ; x_i); the training set stays there.
5. ``Reveal`` when the victim allows it and we hold its token: the training set, to draw the
   best recovered samples beside their originals (the voting is recomputed here with the same
   code the victim runs).

Files under ``out``: ``metrics.json``, ``candidates.npy`` (every candidate on [0, 1]),
``ssim_vs_margin.png`` (Fig. 4), and ``best.png`` (originals above reconstructions; when not
revealed, ``best_candidates.png`` shows the nearest candidates of the best-scored samples).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from fedleak import __version__
from fedleak.attacks import create_attack
from fedleak.attacks.kkt_postprocess import scale_to_unit
from fedleak.attacks.release import ReleasedModel
from fedleak.harness.attacker import (
    AttackSettings,
    _jsonable,
    _reconstruct,
    info_from_describe,
    server_model,
)
from fedleak.harness.client import ReceivedRelease, VictimClient, VictimError
from fedleak.harness.kkt_plots import plot_ssim_vs_margin
from fedleak.harness.kkt_scoring import vote_reconstructions
from fedleak.harness.models import ModelSpec
from fedleak.harness.pictures import save_grid
from fedleak.v1 import victim_pb2 as pb

#: How many of the best-scored training samples the picture shows.
BEST_SHOWN = 20
#: Keys of ``AttackSettings.release`` sent in the ReleaseRequest.
REQUEST_KEYS = ("learning_rate", "max_epochs", "target_loss", "report_every")


def released_model(model: torch.nn.Module, received: ReceivedRelease) -> ReleasedModel:
    """The attack's view of the release: our build of the architecture and the received θ."""
    names = [name for name, _ in model.named_parameters()]
    if sorted(received.parameters) != sorted(names):
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the release carries parameters {sorted(received.parameters)}, the "
                          f"architecture has {names}; run the same fedleak on both sides")
    return ReleasedModel(
        model=model,
        parameters=[received.parameters[name] for name in names],
        parameter_names=names,
        input_shape=received.input_shape,
        num_train=received.num_train,
        value_range=received.value_range,
        metadata=dict(received.metadata),
    )


def run_release_attack(
    client: VictimClient,
    settings: AttackSettings,
    out: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Release, attack, score and write the run (see the module docstring); returns metrics."""
    out.mkdir(parents=True, exist_ok=True)
    described = client.describe()
    info = info_from_describe(described)
    model = server_model(described)
    attack = create_attack(settings.attack, settings.options)
    request = {k: settings.release[k] for k in REQUEST_KEYS if settings.release.get(k)}
    started = time.perf_counter()
    received = client.release(**request, show_progress=settings.show_progress)
    release_s = time.perf_counter() - started
    epsilon = received.metadata.get("epsilon")
    log(f"release {received.release_id[:8]}: n={received.num_train} ({received.binary_task}), "
        f"{received.epochs} epochs, loss {received.loss:.2e}, train accuracy "
        f"{received.train_accuracy:.0%}" + (f", DP epsilon {epsilon}" if epsilon else "")
        + f", {release_s:.1f} s")
    released = released_model(model, received)
    started = time.perf_counter()
    reconstruction = _reconstruct(attack, released, settings, 0)
    attack_s = time.perf_counter() - started
    candidates01 = scale_to_unit(reconstruction.images.detach().cpu().float())
    finite = torch.isfinite(candidates01.flatten(1)).all(1)
    if not bool(finite.any()):
        raise ValueError("every candidate diverged (non-finite); lower the kkt learning rate "
                         "(-o lr-high=...) or use -o optimizer=adam")
    candidates01 = candidates01[finite]
    score = client.score_release(received.release_id, candidates01,
                                 float(settings.release.get("recovered_ssim") or 0.0))
    record = _record(described, settings, attack, received, reconstruction, score,
                     int(finite.sum()), release_s, attack_s, client.address)
    np.save(out / "candidates.npy", candidates01.numpy())
    record["files"]["candidates"] = "candidates.npy"
    margins = torch.tensor([s.margin for s in score.images])
    ssims = torch.tensor([s.ssim for s in score.images])
    plot_ssim_vs_margin(
        out / "ssim_vs_margin.png", margins, ssims, threshold=score.recovered_ssim,
        title=f"{info.name}, n={received.num_train}: {score.recovered}/{len(ssims)} recovered"
        + (f" (DP, ε={epsilon})" if epsilon else ""),
    )
    record["files"]["ssim_vs_margin"] = "ssim_vs_margin.png"
    _save_best(client, described, received.release_id, candidates01, score, out, record)
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    log(f"recovered {score.recovered}/{len(ssims)} training samples at SSIM >= "
        f"{score.recovered_ssim:g} (mean SSIM {score.mean_ssim:.3f}); attack {attack_s:.1f} s")
    return record


def _record(
    described: pb.DescribeResponse,
    settings: AttackSettings,
    attack: Any,
    received: ReceivedRelease,
    reconstruction: Any,
    score: pb.ScoreResponse,
    submitted: int,
    release_s: float,
    attack_s: float,
    address: str,
) -> dict[str, Any]:
    extras = reconstruction.extras
    return {
        "fedleak_version": __version__,
        "threat_model": "release",
        "victim": address,
        "victim_model": str(ModelSpec(described.model.name, dict(described.model.options))),
        "dataset": described.data.dataset,
        "defenses": [d.name for d in described.defenses],
        "attack": settings.attack,
        "attack_config": _jsonable(asdict(attack.config)),
        "settings": _jsonable(asdict(settings)),
        "device": settings.device,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "release": {
            "release_id": received.release_id,
            "num_train": received.num_train,
            "binary_task": received.binary_task,
            "epochs": received.epochs,
            "loss": received.loss,
            "train_accuracy": received.train_accuracy,
            "reached_target": received.reached_target,
            "metadata": received.metadata,
            "wall_time_s": release_s,
        },
        "reconstruction": {
            "iterations": reconstruction.iterations,
            "candidates": int(reconstruction.images.shape[0]),
            "submitted": submitted,
            "run_settings": _jsonable(extras.get("run_settings")),
            "run_objectives": extras.get("run_objectives"),
            "run_diverged": extras.get("run_diverged"),
            "wall_time_s": attack_s,
        },
        "summary": {
            "recovered": score.recovered,
            "recovered_ssim": score.recovered_ssim,
            "num_train": len(score.images),
            "mean_ssim": score.mean_ssim,
            "mean_psnr": score.mean_psnr,
            "max_ssim": max((s.ssim for s in score.images), default=float("nan")),
        },
        "training_samples": [
            {"index": s.index, "nearest_candidate": s.matched_index, "ssim": s.ssim,
             "psnr": s.psnr, "mse": s.mse, "margin": s.margin, "voters": s.voters}
            for s in score.images
        ],
        "files": {},
    }


def _save_best(
    client: VictimClient,
    described: pb.DescribeResponse,
    release_id: str,
    candidates01: torch.Tensor,
    score: pb.ScoreResponse,
    out: Path,
    record: dict[str, Any],
) -> None:
    order = sorted(score.images, key=lambda s: -s.ssim)[:BEST_SHOWN]
    captions = [f"{s.ssim:.2f}" for s in order]
    if described.reveal_enabled and client.token:
        try:
            truth, _ = client.reveal(release_id)
        except VictimError as err:
            record["reveal_error"] = str(err)
        else:
            voted = vote_reconstructions(candidates01, truth)
            record["local_voting_matches_victim"] = bool(np.allclose(
                voted.ssim.numpy(), [s.ssim for s in score.images], atol=1e-4))
            rows = [s.index for s in order]
            save_grid(out / "best.png", voted.reconstructions[rows], truth[rows], captions,
                      title="training samples (top) and their KKT reconstructions, SSIM below")
            record["files"]["best"] = "best.png"
            return
    nearest = candidates01[[s.matched_index for s in order]]
    save_grid(out / "best_candidates.png", nearest, None, captions,
              title="nearest candidates of the best-scored training samples (SSIM)")
    record["files"]["best_candidates"] = "best_candidates.png"


def print_release_summary(record: dict[str, Any], out: Path, echo: Callable[[str], None]) -> None:
    """The end of ``fedleak attack`` for a release: counts, the best samples, the files."""
    s, r = record["summary"], record["release"]
    echo("")
    echo(f"{'sample':>6}  {'SSIM':>6}  {'PSNR dB':>7}  {'margin':>8}  {'voters':>6}")
    best = sorted(record["training_samples"], key=lambda t: -t["ssim"])[:10]
    for t in best:
        echo(f"{t['index']:>6}  {t['ssim']:>6.3f}  {t['psnr']:>7.2f}  {t['margin']:>8.3g}  "
             f"{t['voters']:>6}")
    eps = r["metadata"].get("epsilon")
    echo(f"recovered {s['recovered']}/{s['num_train']} training samples at SSIM >= "
         f"{s['recovered_ssim']:g} (mean SSIM {s['mean_ssim']:.3f})"
         + (f"; DP release, epsilon {eps}" if eps else ""))
    echo(f"metrics: {out / 'metrics.json'}")
    for name in record["files"].values():
        if name.endswith(".png"):
            echo(f"picture: {out / name}")
