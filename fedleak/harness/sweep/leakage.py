"""Leakage of one sweep point: attack K private batches of the point's victim, over the wire.

The sweep starts the point's victim from its typed settings
(:meth:`~fedleak.harness.sweep.spec.Point.victim_settings`: the first K·n images of the split,
n per round, reveal allowed, the defenses' randomness fixed by the point's seed) as a real
process, runs the attacker's own run against it (:func:`~fedleak.harness.attacker.run.run_attack`),
and keeps the means, the per-round pictures and the ε the victim reports. With ``point.victim``
it attacks a victim the user runs instead.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.described import defense_specs
from fedleak.harness.attacker.records import UpdateRun
from fedleak.harness.attacker.run import run_attack
from fedleak.harness.attacker.settings import AttackSettings
from fedleak.harness.sweep.measurements import (
    AttackMeasurement,
    RoundMeasurement,
    float_or_none,
)
from fedleak.harness.sweep.points import Point
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings


def attack_victim_settings(point: Point, checkpoint: str | None) -> VictimSettings:
    """The attacked victim: the first K·n images of the split, n per round, reveal allowed."""
    return dataclasses.replace(
        point.victim_settings(), split=point.split, images=point.images,
        batch_size=point.batch_size, reveal=True, defense_seed=point.seed,
        checkpoint=checkpoint)


def measure_attack(point: Point, run_dir: Path, checkpoint: str | None, token: str | None,
                   on_round: Callable[[str], None],
                   score_token: str | None = None, device: str = "cpu") -> AttackMeasurement:
    """Attack K rounds of the point's victim; the measurement (paths relative to run_dir).

    ``device`` is where the attack runs (``cuda`` for a point placed on a GPU).
    """
    out = run_dir / "points" / point.point_id / "attack"
    if out.exists():  # left by an interrupted attempt: nothing of it was stored
        shutil.rmtree(out)
    settings = AttackSettings(attack=point.attack, options=dict(point.attack_options),
                              seed=point.seed, rounds=point.rounds, show_progress=False,
                              device=device)
    started = time.perf_counter()
    if point.victim:
        with VictimClient(point.victim, token=token, score_token=score_token) as client:
            client.wait_ready(timeout=15)
            described = client.describe()
            record = run_attack(client, settings, out, log=on_round)
    else:
        secret = secrets.token_hex(16)
        with VictimProcess(attack_victim_settings(point, checkpoint), token=secret) as process, \
                VictimClient(process.address, token=secret) as client:
            described = client.describe()
            record = run_attack(client, settings, out, log=on_round)
    if not isinstance(record, UpdateRun):
        raise ValueError(f"attack {point.attack!r} does not attack updates; a sweep measures "
                         "update attacks (run kkt with `fedleak attack`)")
    rounds = [RoundMeasurement(
        mean_psnr=entry.mean_psnr, mean_ssim=entry.mean_ssim,
        label_accuracy=entry.label_accuracy,
        epsilon_total=float_or_none(entry.victim_metadata.get("epsilon_total")),
        files={k: str((out / v).relative_to(run_dir)) for k, v in entry.files.items()},
    ) for entry in record.rounds]
    last = record.rounds[-1].victim_metadata
    summary = record.summary
    return AttackMeasurement(
        attack=point.attack, model=record.header.victim_model, dataset=record.header.dataset,
        run=str(out.relative_to(run_dir)), images=summary.images, mean_psnr=summary.mean_psnr,
        mean_ssim=summary.mean_ssim, label_accuracy=summary.label_accuracy,
        wall_time_s=summary.wall_time_s, rounds=rounds,
        epsilon=float_or_none(last.get("epsilon_total")),
        delta=float_or_none(last.get("delta")), defenses=defense_specs(described),
        measure_time_s=time.perf_counter() - started,
        mean_feature_cosine=summary.mean_feature_cosine,
        mean_feature_relative_error=summary.mean_feature_relative_error,
    )
