"""The server's side of the release threat model: ask for the release, attack it, score, write.

One run (``fedleak attack --attack kkt``):

1. ``Describe`` → the architecture Φ (``kkt-mlp`` of the victim's spec), checked against the
   victim's parameter list.
2. ``Release`` (server-streaming, tqdm bar over the victim's epochs) → θ, n, input box, ε.
3. The attack (e.g. :class:`fedleak.attacks.kkt.reconstruction.KKT`) on the :class:`ReleasedModel`,
   with a bar over its iterations → m candidates per run, pooled over the random search.
4. Each candidate scaled to [0, 1] on its own (App. B.3 step 1), non-finite ones dropped, and
   ``Score`` with the release id: the victim matches them to its training set (NCC nearest
   neighbours and voting, SSIM per training sample) and returns each sample's margin
   y_i Φ(θ; x_i) and its trivial floor (the best constant guess); the training set stays there.
5. ``Reveal`` when the victim allows it and we hold its token: the training set, to draw the
   best recovered samples beside their originals (the voting is recomputed here with the same
   code the victim runs).

Files under ``out``: ``metrics.json``, ``candidates.npy`` (every candidate on [0, 1]),
``ssim_vs_margin.png`` (Fig. 4), and ``best.png`` (originals above reconstructions; when not
revealed, ``best_candidates.png`` shows the nearest candidates of the best-scored samples).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import torch

from fedleak.attacks import Reconstruction, create_attack
from fedleak.attacks.kkt.postprocess import scale_to_unit
from fedleak.attacks.release import ReleasedModel
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.attack_settings import AttackSettings, jsonable
from fedleak.harness.attacker.client import ReceivedRelease, VictimClient, VictimError
from fedleak.harness.attacker.described import dataset_info, model_spec, server_model
from fedleak.harness.attacker.pictures import save_grid
from fedleak.harness.attacker.records import RunHeader
from fedleak.harness.attacker.release.kkt_plots import plot_ssim_vs_margin
from fedleak.harness.attacker.release.release_records import (
    CandidatesRecord,
    ReleaseRecord,
    ReleaseRun,
    ReleaseSummary,
    TrainingSampleRecord,
    floor_lines,
)
from fedleak.harness.metrics.floors import FloorSummary
from fedleak.harness.metrics.kkt_metrics import vote_reconstructions
from fedleak.v1 import victim_pb2 as pb

#: How many of the best-scored training samples the picture shows.
BEST_SHOWN = 20


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
) -> ReleaseRun:
    """Release, attack, score and write the run (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    described = client.describe()
    info = dataset_info(described)
    model = server_model(described)
    attack = create_attack(settings.attack, settings.options)
    started = time.perf_counter()
    received = client.release(**dataclasses.asdict(settings.release),
                              show_progress=settings.show_progress)
    release_s = time.perf_counter() - started
    epsilon = received.metadata.get("epsilon")
    log(f"release {received.release_id[:8]}: n={received.num_train} ({received.binary_task}), "
        f"{received.epochs} epochs, loss {received.loss:.2e}, train accuracy "
        f"{received.train_accuracy:.0%}" + (f", DP epsilon {epsilon}" if epsilon else "")
        + f", {release_s:.1f} s")
    released = released_model(model, received)
    started = time.perf_counter()
    reconstruction = reconstruct_with_progress(
        attack, released, device=settings.device, seed=settings.seed,
        label=f"round 0 {settings.attack}", show=settings.show_progress)
    attack_s = time.perf_counter() - started
    candidates01 = scale_to_unit(reconstruction.images.detach().cpu().float())
    finite = torch.isfinite(candidates01.flatten(1)).all(1)
    if not bool(finite.any()):
        raise ValueError("every candidate diverged (non-finite); lower the kkt learning rate "
                         "(-o lr-high=...) or use -o optimizer=adam")
    candidates01 = candidates01[finite]
    score = client.score_release(received.release_id, candidates01, settings.recovered_ssim)
    run = ReleaseRun(
        header=RunHeader.now(client.address, str(model_spec(described)), info.name,
                             settings.attack, jsonable(dataclasses.asdict(attack.config)),
                             settings.to_json(), settings.device),
        defenses=[d.name for d in described.defenses],
        release=release_record(received, release_s),
        reconstruction=candidates_record(reconstruction, int(finite.sum()), attack_s),
        summary=ReleaseSummary(
            recovered=score.recovered, recovered_ssim=score.recovered_ssim,
            num_train=len(score.images), mean_ssim=score.mean_ssim, mean_psnr=score.mean_psnr,
            max_ssim=max((s.ssim for s in score.images), default=float("nan")),
            floors=score_floors(score),
            recovered_above_floor=score.successes if score.floors_scored else None),
        training_samples=[
            TrainingSampleRecord(s.index, s.matched_index, s.ssim, s.psnr, s.mse, s.margin,
                                 s.voters, *((s.floor_psnr, s.floor_ssim, s.floor_guess)
                                             if score.floors_scored else ()))
            for s in score.images],
    )
    np.save(out / "candidates.npy", candidates01.numpy())
    run.files["candidates"] = "candidates.npy"
    margins = torch.tensor([s.margin for s in score.images])
    ssims = torch.tensor([s.ssim for s in score.images])
    plot_ssim_vs_margin(
        out / "ssim_vs_margin.png", margins, ssims, threshold=score.recovered_ssim,
        title=f"{info.name}, n={received.num_train}: {score.recovered}/{len(ssims)} recovered"
        + (f" (DP, ε={epsilon})" if epsilon else ""),
    )
    run.files["ssim_vs_margin"] = "ssim_vs_margin.png"
    save_best(client, described, received.release_id, candidates01, score, out, run)
    run.write(out)
    log(f"recovered {score.recovered}/{len(ssims)} training samples at SSIM >= "
        f"{score.recovered_ssim:g} (mean SSIM {score.mean_ssim:.3f}); attack {attack_s:.1f} s")
    for line in floor_lines(run.summary):
        log(line)
    return run


def score_floors(score: pb.ScoreResponse) -> FloorSummary | None:
    """The training samples' floors as the victim scored them (None: it scored none)."""
    if not score.floors_scored:
        return None
    return FloorSummary({f.guess: (f.mean_psnr, f.mean_ssim) for f in score.floors},
                        score.mean_floor_psnr, score.mean_floor_ssim, score.mean_floor_margin,
                        score.above_floor, len(score.images), score.floor_margin_db)


def release_record(received: ReceivedRelease, wall: float) -> ReleaseRecord:
    return ReleaseRecord(received.release_id, received.num_train, received.binary_task,
                         received.epochs, received.loss, received.train_accuracy,
                         received.reached_target, received.metadata, wall)


def candidates_record(reconstruction: Reconstruction, submitted: int,
                      wall: float) -> CandidatesRecord:
    extras = reconstruction.extras
    return CandidatesRecord(
        iterations=reconstruction.iterations,
        candidates=int(reconstruction.images.shape[0]),
        submitted=submitted,
        run_settings=jsonable(extras.get("run_settings")),
        run_objectives=extras.get("run_objectives"),
        run_diverged=extras.get("run_diverged"),
        wall_time_s=wall,
    )


def save_best(
    client: VictimClient,
    described: pb.DescribeResponse,
    release_id: str,
    candidates01: torch.Tensor,
    score: pb.ScoreResponse,
    out: Path,
    run: ReleaseRun,
) -> None:
    """``best.png`` (revealed originals above their reconstructions) or ``best_candidates.png``."""
    order = sorted(score.images, key=lambda s: -s.ssim)[:BEST_SHOWN]
    captions = [f"{s.ssim:.2f}" for s in order]
    if described.reveal_enabled and client.token:
        try:
            truth, _ = client.reveal(release_id)
        except VictimError as err:
            run.reveal_error = str(err)
        else:
            voted = vote_reconstructions(candidates01, truth)
            run.local_voting_matches_victim = bool(np.allclose(
                voted.ssim.numpy(), [s.ssim for s in score.images], atol=1e-4))
            rows = [s.index for s in order]
            save_grid(out / "best.png", voted.reconstructions[rows], truth[rows], captions,
                      title="training samples (top) and their KKT reconstructions, SSIM below")
            run.files["best"] = "best.png"
            return
    nearest = candidates01[[s.matched_index for s in order]]
    save_grid(out / "best_candidates.png", nearest, None, captions,
              title="nearest candidates of the best-scored training samples (SSIM)")
    run.files["best_candidates"] = "best_candidates.png"
