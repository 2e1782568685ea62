"""Measure one point — its leakage, then its utility, then its audit — wherever it runs.

The same steps run in the sweep's own process, in a ``--jobs`` worker and in a Ray task on
another node: attack K private batches of the point's victim
(:func:`~fedleak.harness.sweep.measure.leakage.measure_attack`), then train federatedly through the
defended path (:func:`~fedleak.harness.sweep.measure.utility.measure_utility`), then, with a
``[sweep.audit]`` table, play the audit game
(:func:`~fedleak.harness.sweep.measure.point_audit.measure_audit`). Each finished measurement goes
to ``on_measured`` the moment it finishes: the store itself on one machine, a list returned to
the driver from a Ray task (the driver alone writes the store there).

A *pack* of points that differ only in their defenses (``--pack-points``) is measured by
:func:`measure_pack`: their attacks as one packed computation round by round, then each
point's utility; when the packed attack fails, each point is attacked alone, so one bad point
costs its pack mates nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.measure.leakage import measure_attack, measure_attacks_packed
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    AuditMeasurement,
    UtilityMeasurement,
)
from fedleak.harness.sweep.measure.point_audit import measure_audit
from fedleak.harness.sweep.measure.utility import measure_utility
from fedleak.harness.sweep.progress import ProgressSink

#: ``on_measured(kind, measurement, started_at)``: kind is ``attack``, ``utility`` or ``audit``.
OnMeasured = Callable[[str, AttackMeasurement | UtilityMeasurement | AuditMeasurement, float],
                      None]


@dataclass(frozen=True)
class Credentials:
    """Tokens for victims the user runs: the victim's (Reveal) and the evaluator's (Score)."""

    token: str | None = None
    score_token: str | None = None


@dataclass(frozen=True)
class Needs:
    """Which measurements a point still lacks."""

    attack: bool
    utility: bool
    audit: bool = False

    def steps(self, point: Point) -> int:
        """Progress steps: one per attacked round, one per utility round, one for the audit."""
        return ((point.rounds if self.attack else 0)
                + (point.utility_settings.rounds if self.utility else 0)
                + (1 if self.audit else 0))


def measure(
    point: Point,
    root: Path,
    checkpoint: str | None,
    needs: Needs,
    credentials: Credentials,
    progress: ProgressSink,
    on_measured: OnMeasured,
    device: str = "cpu",
) -> None:
    """Measure what ``needs`` says under ``root`` (the run folder, or a worker's scratch copy
    of its layout); exceptions propagate after the finished measurements were handed over."""
    pid = point.point_id
    if needs.attack:
        started = time.time()
        leakage = measure_attack(point, root, checkpoint, credentials.token,
                                 lambda text: progress.advance(pid, "attack " + text),
                                 credentials.score_token, device=device)
        on_measured("attack", leakage, started)
    if needs.utility:
        started = time.time()
        utility = measure_utility(point, checkpoint,
                                  lambda _, text: progress.advance(pid, text),
                                  credentials.token)
        on_measured("utility", utility, started)
    if needs.audit:
        started = time.time()
        audit = measure_audit(point, root, checkpoint,
                              lambda text: progress.advance(pid, text), credentials.token,
                              credentials.score_token)
        on_measured("audit", audit, started)


def measure_pack(
    points: Sequence[Point],
    root: Path,
    checkpoints: Sequence[str | None],
    needs: Sequence[Needs],
    credentials: Credentials,
    progress: ProgressSink,
    on_measured: Sequence[OnMeasured],
    device: str = "cpu",
) -> list[Exception | None]:
    """Measure several points, their attacks packed (:func:`measure_attacks_packed`) when more
    than one needs one; returns each point's exception or None (measurements that finished
    were handed to its ``on_measured`` either way)."""
    attacking = [i for i, need in enumerate(needs) if need.attack]
    attacked: set[int] = set()
    if len(attacking) > 1:
        started = time.time()
        try:
            leakages = measure_attacks_packed(
                [points[i] for i in attacking], root, [checkpoints[i] for i in attacking],
                lambda pid, text: progress.advance(pid, "attack " + text), device=device)
        except Exception as err:  # each point is attacked alone below
            for i in attacking:
                progress.advance(points[i].point_id,
                                 f"packed attack failed ({type(err).__name__}); alone")
        else:
            for i, leakage in zip(attacking, leakages, strict=True):
                on_measured[i]("attack", leakage, started)
                attacked.add(i)
    errors: list[Exception | None] = []
    for i, point in enumerate(points):
        remaining = Needs(attack=needs[i].attack and i not in attacked, utility=needs[i].utility,
                          audit=needs[i].audit)
        try:
            measure(point, root, checkpoints[i], remaining, credentials, progress,
                    on_measured[i], device=device)
        except Exception as err:  # recorded with the point; the others go on
            errors.append(err)
        else:
            errors.append(None)
    return errors
