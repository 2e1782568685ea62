"""The audit of one sweep point: ε lower bounds for its defense chain, beside the ε it claims.

With a ``[sweep.audit]`` table every point also plays the audit game (docs/audit.md) against a
victim process of its own — the point's model, data, protocol and defense chain, its first
K·n images, the defenses' randomness (and so the coins) fixed by the point's seed, the
global model (or checkpoint) as θ — through the attacker's own
:func:`~fedleak.harness.attacker.games.audit_trials.run_audit`. Against a victim the user runs
(``point.victim``) the audit talks to that address, which must have been started with
``--allow-audit``. What the store keeps is an
:class:`~fedleak.harness.sweep.measure.measurements.AuditMeasurement`; ``audit.json`` and
``audit.png`` go to ``RUN/points/<point_id>/audit/``.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.games.audit_trials import AuditRecord, AuditSettings, run_audit
from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.measure.leakage import attack_victim_settings
from fedleak.harness.sweep.measure.measurements import AuditMeasurement
from fedleak.harness.victim.process import VictimProcess


def measure_audit(point: Point, run_dir: Path, checkpoint: str | None,
                  on_step: Callable[[str], None], token: str | None = None,
                  score_token: str | None = None) -> AuditMeasurement:
    """Play ``point.audit`` against the point's victim; the measurement (paths run-relative)."""
    if point.audit is None:
        raise ValueError(f"point {point.label!r} has no [sweep.audit] table")
    out = run_dir / "points" / point.point_id / "audit"
    if out.exists():  # left by an interrupted attempt: nothing of it was stored
        shutil.rmtree(out)
    settings = AuditSettings(**point.audit, show_progress=False)
    started = time.perf_counter()
    if point.victim:
        with VictimClient(point.victim, token=token, score_token=score_token) as client:
            client.wait_ready(timeout=15)
            record = run_audit(client, settings, out, log=on_step)
    else:
        victim = dataclasses.replace(attack_victim_settings(point, checkpoint), reveal=False,
                                     audit=True)
        evaluator = secrets.token_hex(16)
        with VictimProcess(victim, env={"FEDLEAK_SCORE_TOKEN": evaluator}) as process, \
                VictimClient(process.address, score_token=evaluator) as client:
            record = run_audit(client, settings, out, log=on_step)
    on_step(f"audit: {record.verdict}")
    return audit_measurement(record, str(out.relative_to(run_dir)),
                             time.perf_counter() - started)


def audit_measurement(record: AuditRecord, run: str, seconds: float) -> AuditMeasurement:
    """What the store keeps of one audit."""
    bounds = [b for b in record.bounds if not b.is_estimate]
    claimed = record.claimed_epsilon
    first = bounds[0] if bounds else None
    return AuditMeasurement(
        epsilon_lb={name: max(b.epsilon for b in bounds if b.estimator == name)
                    for name in dict.fromkeys(b.estimator for b in bounds)},
        estimates={b.estimator: b.epsilon for b in record.bounds if b.is_estimate},
        epsilon_claimed=claimed if math.isfinite(claimed) else None,
        confidence=first.confidence if first is not None and first.confidence else 0.0,
        trials=record.trials, trials_in=first.trials_in if first else 0,
        trials_out=first.trials_out if first else 0, delta=float(record.claim["delta"]),
        canary=record.canary["text"], threat_model=record.threat_model,
        threshold_rule=first.threshold_rule if first else "",
        accountant=str(record.claim["accountant"]), violation=record.violation, run=run,
        wall_time_s=seconds)
