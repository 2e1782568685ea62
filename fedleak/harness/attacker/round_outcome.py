"""What a finished round of an update attack leaves: its :class:`~fedleak.harness.attacker.
records.RoundRecord` in ``metrics.json`` (scores, replay exactness, privacy spent), the line the
terminal shows, the ``comparison.png`` of truth above reconstruction, and, for the whole run,
where its successes place against κ and the DP bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedleak.attacks import Reconstruction
from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient, VictimError
from fedleak.harness.attacker.pictures import save_grid
from fedleak.harness.attacker.records import FeatureRecord, ImageRecord, RoundRecord, UpdateRun
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.replay_fidelity import INEXACT, MODELLED, replay_status
from fedleak.harness.metrics.floors import NOTHING_RECOVERED, FloorSummary
from fedleak.harness.metrics.success_bounds import (
    SuccessPlacement,
    place,
    prior_kappa,
    prior_mean_psnr,
    round_mechanism,
)
from fedleak.v1 import victim_pb2 as pb

#: What a reconstruction's extras say about the parts it ran with (metrics.json ``parts``).
PART_KEYS = ("objective", "replay", "optimizer", "priors", "bn_source", "part_reasons")


def round_record(
    received: ReceivedUpdate, reconstruction: Reconstruction, score: pb.ScoreResponse | None,
    wall: float,
) -> RoundRecord:
    """What one round leaves in ``metrics.json`` (``score`` None: not scored)."""
    scored = score is not None
    entry = RoundRecord(
        round_id=received.round_id,
        update_kind=received.update_kind,
        num_images=received.num_images,
        local_steps=received.local_steps,
        victim_metadata=dict(received.metadata),
        iterations=reconstruction.iterations,
        objective=reconstruction.objective,
        restart_objectives=reconstruction.restart_objectives,
        wall_time_s=wall,
        labels=[int(y) for y in reconstruction.labels.cpu().tolist()],
        mean_psnr=None, mean_ssim=None, mean_mse=None, label_accuracy=None,
        fisher_note=score.fisher_note if score is not None and score.images
        and not score.fisher_bounded and score.fisher_note else None,
        warnings=list(reconstruction.warnings),
        privacy=privacy_spent(received.metadata),
        packed_with=reconstruction.extras.get("packed_with"),
        padding=list(reconstruction.padding) or None,
        attack_extras={k: v for k, v in reconstruction.extras.items()
                       if isinstance(v, int | float | str | bool)} or None,
        probe_rounds=reconstruction.extras.get("probe_rounds"),
        parts={k: reconstruction.extras[k] for k in PART_KEYS
               if k in reconstruction.extras} or None,
        truncated=reconstruction.truncated,
    )
    for key, value in score_fields(score).items():
        setattr(entry, key, value)
    status, reasons = replay_status(received.protocol, received.num_images,
                                    extras=reconstruction.extras)
    if status == INEXACT:
        entry.replay, entry.inexact_reasons = INEXACT, reasons
    elif status == MODELLED:
        entry.replay, entry.replay_model = MODELLED, reasons
    if reconstruction.features is not None:
        entry.feature_layer = reconstruction.feature_layer
        if scored and score is not None and score.features_scored:
            entry.mean_feature_cosine = score.mean_feature_cosine
            entry.mean_feature_relative_error = score.mean_feature_relative_error
            entry.features = [FeatureRecord(f.index, f.matched_index, f.cosine,
                                            f.relative_error) for f in score.features]
    return entry


def score_fields(score: pb.ScoreResponse | None) -> dict[str, Any]:
    """The :class:`RoundRecord` fields a victim's (or node's) score fills."""
    if score is None:
        return {}
    images = bool(score.images)
    floored = images and score.floors_scored
    return {
        "mean_psnr": score.mean_psnr if images else None,
        "mean_ssim": score.mean_ssim if images else None,
        "mean_mse": score.mean_mse if images else None,
        "label_accuracy": score.label_accuracy if score.labels_scored else None,
        "images": [ImageRecord(s.index, s.matched_index, s.psnr, s.ssim, s.mse, s.padding,
                               s.exact, s.fisher_psnr_ceiling if score.fisher_bounded else None,
                               s.floor_psnr if floored else None,
                               s.floor_ssim if floored else None,
                               s.floor_guess if floored else None)
                   for s in score.images],
        "exact": score.exact if images else None,
        "successes": score.successes if images and score.success_psnr > 0 else None,
        "best_psnr": score.best_psnr if images and score.best_scored else None,
        "floors": floors_of(score) if floored else None,
    }


def floors_of(score: pb.ScoreResponse) -> FloorSummary | None:
    """The trivial floors a victim's (or node's) ``Score`` answer carries, or None."""
    if not score.floors_scored:
        return None
    return FloorSummary({f.guess: (f.mean_psnr, f.mean_ssim) for f in score.floors},
                        score.mean_floor_psnr, score.mean_floor_ssim, score.mean_floor_margin,
                        score.above_floor, len(score.images), score.floor_margin_db)


def fill_scores(entry: RoundRecord, score: pb.ScoreResponse | None) -> None:
    """A victim's (or node's) scores into a round recorded before it was scored."""
    for key, value in score_fields(score).items():
        setattr(entry, key, value)


def placement(run: UpdateRun, described: pb.DescribeResponse,
              protocol: Protocol) -> SuccessPlacement | None:
    """Success at :data:`SUCCESS_PSNR` over the run's scored images, κ of the public prior
    (the data set's other split, loaded here when it is bundled or under the same path) and the
    DP bound of the published mechanism; None when nothing was scored."""
    measured = [r for r in run.rounds if r.truncated is None]  # a truncated round never counts
    psnrs = [img.psnr for r in measured for img in r.images]
    if not psnrs:
        return None
    try:
        baseline = prior_kappa(described.data.dataset, described.data.split)
    except (OSError, ValueError) as err:  # a torchvision data set not on this machine
        run.warnings.append(f"no κ for the success threshold: {err}")
        baseline = None
    first = measured[0]
    mechanism = round_mechanism(first.victim_metadata,
                                [(d.name, dict(d.params)) for d in described.defenses],
                                1 if first.update_kind == "gradient" else protocol.local_epochs)
    counted = [r.successes for r in measured if r.images]
    successes = sum(c for c in counted if c is not None) \
        if counted and all(c is not None for c in counted) else None
    placed = place(psnrs, baseline, mechanism, successes=successes)
    if baseline is not None:
        placed.prior_psnr = prior_mean_psnr(described.data.dataset, described.data.split)
    return placed


def iterations_used(attack: object, reconstruction: Reconstruction) -> tuple[int, int] | None:
    """(iterations the attack ran, iterations asked: ``iterations`` × ``restarts`` of its
    config) for the printed line; None for an attack without iterations."""
    config = getattr(attack, "config", None)
    asked = getattr(config, "iterations", None)
    if not isinstance(asked, int) or isinstance(asked, bool):
        return None
    asked *= int(getattr(config, "restarts", 1) or 1)
    return int(reconstruction.iterations), asked


def privacy_spent(metadata: dict[str, str]) -> dict[str, float] | None:
    """The victim's DP accounting of a round as numbers (``epsilon_total``, ``epsilon_round``,
    ``delta``), or None when it reports none."""
    out = {}
    for key in ("epsilon_total", "epsilon_round", "delta"):
        try:
            out[key] = float(metadata[key])
        except (KeyError, ValueError):
            continue
    return out or None


def round_line(index: int, score: pb.ScoreResponse, wall: float,
               privacy: dict[str, float] | None = None, inexact: bool = False, *,
               modelled: bool = False, iterations: tuple[int, int] | None = None,
               truncated: str | None = None) -> str:
    """One line per finished round for the terminal (``inexact``: labelled a lower bound;
    ``modelled``: the user's order unknown, modelled; ``iterations``: (used, asked);
    ``truncated``: a safety limit cut the attack, labelled not a measurement)."""
    parts = ["TRUNCATED by the safety time limit (not a measurement)"] if truncated else \
        ["LOWER BOUND (inexact replay)"] if inexact else \
        ["order unknown, modelled"] if modelled else []
    if score.images:
        parts.append(f"PSNR {score.mean_psnr:.2f} dB, SSIM {score.mean_ssim:.3f}")
        if score.floors_scored:
            parts.append(floor_part(score))
    if score.features_scored:
        parts.append(f"features: cosine {score.mean_feature_cosine:.6f}, relative error "
                     f"{score.mean_feature_relative_error:.2e}")
    if score.labels_scored:
        parts.append(f"labels {score.label_accuracy:.0%}")
    if privacy and "epsilon_total" in privacy:
        parts.append(f"ε {privacy['epsilon_total']:.4g}")
    if iterations is not None:
        parts.append(f"{iterations[0]} of {iterations[1]} iterations")
    return f"round {index}: " + ", ".join([*parts, f"{wall:.1f} s"])


def floor_part(score: pb.ScoreResponse) -> str:
    """The floor beside a round's figure: its PSNR, the margin over it, and in words when no
    image is above it."""
    text = (f"floor {score.mean_floor_psnr:.2f} dB (margin {score.mean_floor_margin:+.2f} dB, "
            f"{score.above_floor} of {len(score.images)} above it")
    return text + (f": {NOTHING_RECOVERED})" if score.above_floor == 0 else ")")


def save_comparison(
    client: VictimClient,
    described: pb.DescribeResponse,
    received: ReceivedUpdate,
    images: torch.Tensor,
    score: pb.ScoreResponse,
    round_dir: Path,
    entry: RoundRecord,
    out: Path,
) -> None:
    """``comparison.png`` (truth above reconstruction) when the truth can be revealed."""
    if not (described.reveal_enabled and client.token):
        return
    try:
        truth, _ = client.reveal(received.round_id)
    except VictimError as err:
        entry.reveal_error = str(err)
        return
    if received.user_ids:  # secure aggregation: the truth of the users whose data was attacked
        per_user = truth.shape[0] // described.num_users
        truth = torch.cat([truth[u * per_user:(u + 1) * per_user]
                           for u in sorted(received.user_ids)])
    matched = torch.stack([images[s.matched_index] for s in score.images])
    captions = [f"{s.psnr:.1f} dB" for s in score.images]
    path = save_grid(round_dir / "comparison.png", matched, truth, captions,
                     title=f"mean PSNR {score.mean_psnr:.2f} dB")
    entry.files["comparison"] = str(path.relative_to(out))
