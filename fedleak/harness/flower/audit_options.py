"""What an audit is told and what it keeps: its options, and the run folder it claims.

:class:`AuditOptions` are the keyword arguments of both Flower audits
(:class:`~fedleak.harness.flower.leakage_audit.LeakageAudit`,
:class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit`); :func:`claim_folder` makes
``out`` ready for a run without ever mixing two runs' rounds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import torch

from fedleak.harness.attacker.records import METRICS_NAME
from fedleak.harness.flower.procedure import LocalProcedure
from fedleak.harness.flower.score_answers import ScoreAnswer

#: reply metrics (from fedleak's train helper) that become the round's public metadata
PRIVACY_METRICS = {"epsilon-total": "epsilon_total", "epsilon-round": "epsilon_round",
                   "delta": "delta"}

#: asks for a reconstruction's scores: ``scorer(images on [0, 1], labels, padding slots)``
Scorer = Callable[[torch.Tensor | None, list[int], list[int]], ScoreAnswer]


class NotAttackable(Exception):
    """An update the audit cannot attack; the message says why (recorded, never raised out)."""


class AuditOptions(TypedDict, total=False):
    """How an audit attacks, as keyword arguments of either wrapper (defaults in brackets).

    ``attack`` names the fedleak attack [inverting-gradients] (a shuffling client's update —
    several mini-batches per epoch in a secret order — is attacked with ``fedavg-shuffled``,
    which models the order, when ``attack`` is one of :data:`ORDER_BLIND`), ``options`` its
    options, whose ``iterations`` × ``restarts`` are each update's budget in objective
    evaluations; ``seed`` [0] seeds it (plus the round − 1); ``device`` [cpu];
    ``record_only`` [False] writes a recording for ``fedleak attack --from-recording``
    instead; ``score`` [True] asks the nodes to score, waiting ``score_timeout`` [600] s;
    ``show_progress`` [False]; ``log`` [print] takes the audit's lines. ``procedure`` [None]
    is what the clients do locally when the train config does not say it
    (:class:`~fedleak.harness.flower.procedure.LocalProcedure`). ``background`` [True]
    attacks off the round's critical path in a worker process niced by ``nice`` [10] with
    ``threads`` [1] torch threads, at most ``queue`` [8] updates waiting (more are skipped,
    and recorded); the federation's end waits for it at most ``drain_timeout`` [None: as long
    as it takes] s. ``overwrite`` [False]: an ``out`` that already holds a run is refused
    unless this is set, which removes that run's files first. ``probe`` [None]:
    malicious-server attacks (``trap-weights``, ``fishing``) run in probe rounds after the
    federation, their node updates discarded, with ``probe_options`` per attack and
    ``probe_public`` images on [0, 1] like the nodes' (:mod:`~fedleak.harness.flower.probe`;
    under SecAgg+, :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit` probes
    workflow round ``probe_round`` with trap weights on the aggregate).
    """

    attack: str
    options: Mapping[str, Any] | None
    seed: int
    device: str
    record_only: bool
    score: bool
    score_timeout: float
    show_progress: bool
    log: Callable[[str], None]
    procedure: LocalProcedure | None
    background: bool
    queue: int
    nice: int
    threads: int
    drain_timeout: float | None
    overwrite: bool
    probe: str | Sequence[str] | None
    probe_options: Mapping[str, Mapping[str, Any]] | None
    probe_public: torch.Tensor | None
    probe_round: int | None


#: attacks whose replay takes the images in a fixed order: on a shuffling client's update the
#: audit runs ``fedavg-shuffled`` (the same options) instead, which models the order
ORDER_BLIND = ("inverting-gradients", "fedavg")
SHUFFLED_ATTACK = "fedavg-shuffled"
#: what an audit run folder holds (removed by ``overwrite``, and nothing else)
RUN_FILES = (METRICS_NAME, "recording.json")
RUN_FOLDERS = "round-*"


class FolderInUse(ValueError):
    """``out`` already holds an audit run; the message says how to keep or replace it."""


def claim_folder(out: Path, overwrite: bool) -> None:
    """Make ``out`` ready for a new run: refuse one that holds a run (``metrics.json``,
    ``recording.json``, ``round-*`` folders) unless ``overwrite``, which removes exactly those
    (a rerun never mixes old and new rounds)."""
    found = [out / name for name in RUN_FILES if (out / name).exists()] + \
        sorted(p for p in out.glob(RUN_FOLDERS) if p.is_dir())
    if not found:
        return
    if not overwrite:
        raise FolderInUse(f"{out} already holds an audit run ({found[0].name}"
                          f"{' and more' if len(found) > 1 else ''}): give another --out, or "
                          "--overwrite (overwrite=True) to remove that run first")
    for path in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
