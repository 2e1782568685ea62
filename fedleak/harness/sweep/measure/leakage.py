"""Leakage of one sweep point: attack K private batches of the point's victim, over the wire.

The sweep starts the point's victim from its typed settings
(:meth:`~fedleak.harness.sweep.grid.spec.Point.victim_settings`: the first K·n images of the split,
n per round, reveal allowed, the defenses' randomness fixed by the point's seed) as a real
process, runs the attacker's own run against it (:func:`~fedleak.harness.attacker.run.run_attack`),
and keeps the means, the per-round pictures and the ε the victim reports. With ``point.victim``
it attacks a victim the user runs instead.

Points that differ only in their defenses (same attack, options, model, data, rounds and seed:
:func:`pack_key`) can be measured as a pack (``fedleak sweep --pack-points K``): the sweep
starts all their victims, and each round of all of them is attacked as one packed computation
(:func:`~fedleak.harness.attacker.update_attack.attack_packed`), so one GPU stays busy;
each point still gets its own run folder, scores and measurement, the ones it gets alone.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from fedleak.attacks import attack_class
from fedleak.harness.attacker.attack_settings import AttackSettings
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.described import defense_specs
from fedleak.harness.attacker.records import UpdateRun
from fedleak.harness.attacker.run import run_attack
from fedleak.harness.attacker.text.text_records import TextRun
from fedleak.harness.attacker.update_attack import attack_packed, open_server
from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    RoundMeasurement,
    float_or_none,
)
from fedleak.harness.sweep.measure.text_measure import text_attack_measurement
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings
from fedleak.v1 import victim_pb2 as pb


def attack_victim_settings(point: Point, checkpoint: str | None) -> VictimSettings:
    """The attacked victim: the first K·n images of the split, n per round, reveal allowed."""
    return dataclasses.replace(
        point.victim_settings(), split=point.split, images=point.images,
        batch_size=point.batch_size, reveal=True, defense_seed=point.seed,
        checkpoint=checkpoint)


def pack_key(point: Point) -> str | None:
    """What points must share to be attacked as one pack: everything measured but the
    defenses and the utility training; None for a point against a user-run victim."""
    if point.victim:
        return None
    measured = point.measured()
    for key in ("defenses", "utility", "train_epochs"):
        measured.pop(key, None)
    return json.dumps(measured, sort_keys=True)


def _run_folder(point: Point, run_dir: Path) -> Path:
    out = run_dir / "points" / point.point_id / "attack"
    if out.exists():  # left by an interrupted attempt: nothing of it was stored
        shutil.rmtree(out)
    return out


def _settings(point: Point, device: str) -> AttackSettings:
    return AttackSettings(attack=point.attack, options=dict(point.attack_options),
                          seed=point.seed, rounds=point.rounds, show_progress=False,
                          device=device)


def measure_attack(point: Point, run_dir: Path, checkpoint: str | None, token: str | None,
                   on_round: Callable[[str], None],
                   score_token: str | None = None, device: str = "cpu") -> AttackMeasurement:
    """Attack K rounds of the point's victim; the measurement (paths relative to run_dir).

    ``device`` is where the attack runs (``cuda`` for a point placed on a GPU).
    """
    out = _run_folder(point, run_dir)
    settings = _settings(point, device)
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
    if isinstance(record, TextRun):
        return text_attack_measurement(point, record, described, out, run_dir,
                                       time.perf_counter() - started)
    if not isinstance(record, UpdateRun):
        raise _not_an_update_attack(point.attack)
    return attack_measurement(point, record, described, out, run_dir,
                              time.perf_counter() - started)


def measure_attacks_packed(
    points: Sequence[Point], run_dir: Path, checkpoints: Sequence[str | None],
    on_round: Callable[[str, str], None], device: str = "cpu",
) -> list[AttackMeasurement]:
    """Attack the K rounds of several points' victims, round by round, as packs.

    The points must share :func:`pack_key`; ``on_round(point_id, text)`` hears each point's
    rounds. Every victim is started (each with its own token) before the first round; each
    point's measurement time is the pack's divided by the number of points.
    """
    keys = {pack_key(point) for point in points}
    if None in keys or len(keys) != 1:
        raise ValueError("points packed together must differ only in their defenses and be "
                         "measured against victims the sweep starts")
    if attack_class(points[0].attack).threat_model != "update":
        raise _not_an_update_attack(points[0].attack)
    started = time.perf_counter()
    with ExitStack() as stack:
        servers = []
        for point, checkpoint in zip(points, checkpoints, strict=True):
            secret = secrets.token_hex(16)
            process = stack.enter_context(
                VictimProcess(attack_victim_settings(point, checkpoint), token=secret))
            client = stack.enter_context(VictimClient(process.address, token=secret))
            servers.append(open_server(client, _settings(point, device),
                                       _run_folder(point, run_dir),
                                       _point_log(on_round, point.point_id)))
        try:
            for index in range(points[0].rounds):
                attack_packed([(server, index) for server in servers])
        except KeyboardInterrupt:
            for server in servers:
                server.close("interrupted")
            raise
        for server in servers:
            server.close("finished")
    share = (time.perf_counter() - started) / len(points)
    return [attack_measurement(point, server.run, server.described, server.out, run_dir, share)
            for point, server in zip(points, servers, strict=True)]


def _not_an_update_attack(attack: str) -> ValueError:
    return ValueError(f"attack {attack!r} does not attack updates; a sweep measures update "
                      "attacks (run kkt with `fedleak attack`)")


def _point_log(on_round: Callable[[str, str], None], point_id: str) -> Callable[[str], None]:
    def log(text: str) -> None:
        on_round(point_id, text)

    return log


def attack_measurement(point: Point, record: UpdateRun, described: pb.DescribeResponse,
                       out: Path, run_dir: Path, seconds: float) -> AttackMeasurement:
    """What the store keeps of one point's attack run (paths relative to ``run_dir``)."""
    rounds = [RoundMeasurement(
        mean_psnr=entry.mean_psnr, mean_ssim=entry.mean_ssim,
        label_accuracy=entry.label_accuracy,
        epsilon_total=float_or_none(entry.victim_metadata.get("epsilon_total")),
        files={k: str((out / v).relative_to(run_dir)) for k, v in entry.files.items()},
        floor_psnr=None if entry.floors is None else entry.floors.mean_psnr,
    ) for entry in record.rounds]
    last = record.rounds[-1].victim_metadata
    summary = record.summary
    placed = record.placement
    measured = AttackMeasurement(
        attack=point.attack, model=record.header.victim_model, dataset=record.header.dataset,
        run=str(out.relative_to(run_dir)), images=summary.images, mean_psnr=summary.mean_psnr,
        mean_ssim=summary.mean_ssim, label_accuracy=summary.label_accuracy,
        wall_time_s=summary.wall_time_s, rounds=rounds,
        epsilon=float_or_none(last.get("epsilon_total")),
        delta=float_or_none(last.get("delta")), defenses=defense_specs(described),
        measure_time_s=seconds,
        mean_feature_cosine=summary.mean_feature_cosine,
        mean_feature_relative_error=summary.mean_feature_relative_error,
        server_role=record.header.server_role, exact=summary.exact,
        fisher_psnr_ceiling=summary.mean_fisher_psnr_ceiling, truncated=record.truncated,
    )
    floors = summary.floors
    if floors is not None:
        measured.floor_psnr, measured.floor_ssim = floors.mean_psnr, floors.mean_ssim
        measured.floor_margin, measured.above_floor = floors.mean_margin, floors.above
    if placed is not None:
        measured.success_psnr, measured.successes = placed.success_psnr, placed.successes
        measured.success_rate = placed.success_rate
        measured.kappa, measured.kappa_upper = placed.kappa, placed.kappa_upper
        measured.prior_psnr = placed.prior_psnr
        measured.reconstruction_bound = placed.bound
        measured.reconstruction_bound_se = placed.bound_standard_error
        measured.bound_method = placed.bound_method
        measured.noise_multiplier = placed.noise_multiplier
        measured.sample_rate, measured.dp_steps = placed.sample_rate, placed.dp_steps
    return measured
