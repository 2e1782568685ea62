"""What both Flower audits share: the model, the attack, the run folder, and one update's audit.

:class:`~fedleak.harness.flower.leakage_audit.LeakageAudit` (every node's reply, Message-API
strategies) and :class:`~fedleak.harness.flower.secagg.AggregateAudit` (the aggregate Flower's
SecAgg+ hands a legacy strategy) differ in what they read off a round; from a
:class:`~fedleak.harness.attacker.client.ReceivedUpdate` on, they are the same
:class:`Auditor`: record it (``record_only``) or build the attack's observation with the
victim's own replay (:func:`~fedleak.harness.attacker.update_attack.observation_for`), run the
attack, have the reconstruction scored on the node(s) that hold the batch
(:mod:`~fedleak.harness.flower.node_scoring`; the truth stays there) and write the run folder
``fedleak attack`` writes (``metrics.json``, ``reconstruction.png``, ``comparison.png`` where
the nodes reveal).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np
import torch
from flwr.app import Message
from flwr.serverapp import Grid
from torch import nn

from fedleak.attacks import Attack, Observation, create_attack
from fedleak.attacks.epochs import epoch_copies
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.attack_settings import jsonable
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.pictures import save_grid
from fedleak.harness.attacker.recording import write_round
from fedleak.harness.attacker.records import METRICS_NAME, RoundRecord, RunHeader, UpdateRun
from fedleak.harness.attacker.round_outcome import round_line, round_record
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.federated.replay_fidelity import INEXACT
from fedleak.harness.flower.arrays import tensors
from fedleak.harness.flower.node_scoring import (
    REVEALED,
    SCORE_ACTION,
    SCORE_MESSAGE_TYPE,
    SCORE_METRICS,
    submission_content,
)
from fedleak.harness.flower.procedure import LocalProcedure
from fedleak.harness.metrics.image_metrics import EXACT_PSNR, SUCCESS_PSNR
from fedleak.harness.zoo.datasets import DatasetInfo, dataset_info, denormalize
from fedleak.harness.zoo.models import build_model
from fedleak.v1 import victim_pb2 as pb

#: reply metrics (from fedleak's train helper) that become the round's public metadata
PRIVACY_METRICS = {"epsilon-total": "epsilon_total", "epsilon-round": "epsilon_round",
                   "delta": "delta"}

#: a node's (or the nodes') answer to a score query: (scores, revealed truth, why unscored)
ScoreAnswer = tuple[pb.ScoreResponse | None, torch.Tensor | None, str | None]
#: asks for a reconstruction's scores: ``scorer(images on [0, 1], labels, padding slots)``
Scorer = Callable[[torch.Tensor | None, list[int], list[int]], ScoreAnswer]


class NotAttackable(Exception):
    """An update the audit cannot attack; the message says why (recorded, never raised out)."""


class AuditOptions(TypedDict, total=False):
    """How an audit attacks, as keyword arguments of either wrapper (defaults in brackets).

    ``attack`` names the fedleak attack [inverting-gradients], ``options`` its options;
    ``seed`` [0] seeds it (plus the round − 1); ``device`` [cpu]; ``record_only`` [False]
    writes a recording for ``fedleak attack --from-recording`` instead; ``score`` [True] asks
    the nodes to score, waiting ``score_timeout`` [600] s; ``show_progress`` [False]; ``log``
    [print] takes the audit's lines. ``procedure`` [None] is what the clients do locally when
    the train config does not say it (:class:`~fedleak.harness.flower.procedure.
    LocalProcedure`). ``budget`` [3.0] bounds the attack's time per round to that multiple of
    the round it watches, at least ``min_budget_s`` [10] s, shared by the round's replies
    (:func:`capped_iterations`; None: the attack's own iterations, unbounded). ``overwrite``
    [False]: an ``out`` that already holds a run is refused unless this is set, which
    removes that run's files first.
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
    budget: float | None
    min_budget_s: float
    overwrite: bool


#: the audit's default time budget: this multiple of the round's wall time, per round
DEFAULT_BUDGET = 3.0
#: ... and at least this many seconds per round (a round in a test takes milliseconds)
DEFAULT_MIN_BUDGET_S = 10.0
#: an attack iteration's cost over one timed objective evaluation (priors, optimiser step)
LOOP_OVERHEAD = 1.25
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


class Auditor:
    """Attack (or record) updates read off a Flower round; write the run folder (module doc).

    ``model`` is a fedleak model spec (``lenet-zhu``, ``mlp:width=64``) or an ``nn.Module``
    whose state dict is what the federation trains; ``dataset`` names the data set (or is a
    :class:`DatasetInfo`): shape, classes and normalisation are public facts the attack uses.
    ``settings`` go into ``metrics.json``'s header beside the attack's; ``audit`` are the
    :class:`AuditOptions`.
    """

    def __init__(self, model: str | nn.Module, dataset: str | DatasetInfo, out: Path, *,
                 settings: Mapping[str, Any] | None = None,
                 **audit: Unpack[AuditOptions]) -> None:
        attack = audit.get("attack", "inverting-gradients")
        seed, device = audit.get("seed", 0), audit.get("device", "cpu")
        record_only, score = audit.get("record_only", False), audit.get("score", True)
        self.info = dataset if isinstance(dataset, DatasetInfo) else dataset_info(dataset)
        if isinstance(model, str):
            self.model_spec = model
            self.model = build_model(model, self.info.shape, self.info.num_classes)
        else:
            self.model_spec, self.model = "", model
        if record_only and not self.model_spec:
            raise ValueError("record_only needs the model as a fedleak model spec (a string), "
                             "so `fedleak attack --from-recording` can rebuild it")
        self.model.to(device)
        self.attack_name, self.options = attack, dict(audit.get("options") or {})
        self.attack = create_attack(attack, self.options)
        self.out, self.seed, self.device = Path(out), seed, device
        self.record_only, self.score = record_only, score
        self.score_timeout = audit.get("score_timeout", 600.0)
        self.show_progress, self.log = audit.get("show_progress", False), audit.get("log", print)
        self.procedure = audit.get("procedure")
        self.budget = audit.get("budget", DEFAULT_BUDGET)
        self.min_budget_s = float(audit.get("min_budget_s", DEFAULT_MIN_BUDGET_S))
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"budget must be a positive multiple of the round's time, or None "
                             f"(unbounded); got {self.budget!r}")
        claim_folder(self.out, audit.get("overwrite", False))
        self.out.mkdir(parents=True, exist_ok=True)
        self.run = UpdateRun(RunHeader.now(
            "flower federation", self.model_spec or type(self.model).__name__, self.info.name,
            attack, jsonable(dataclasses.asdict(self.attack.config)),
            {"attack": attack, "options": jsonable(self.options), "seed": seed,
             "record_only": record_only, "score": score,
             "budget": None if self.budget is None else
             f"{self.budget:g} x the round's wall time, at least {self.min_budget_s:g} s, "
             "per round", "stated_procedure": None if self.procedure is None else
             self.procedure.assumed(), **(settings or {})}, device))
        self.run.write(self.out)
        self._grid: Grid | None = None
        #: the wall time of the round being audited (sent → replies in) and its replies
        self._round_seconds: float | None = None
        self._round_replies = 1
        #: readable names of the nodes seen, by Flower node id (stable within a run)
        self.node_names: dict[int, str] = {}

    def node_name(self, node: int, reported: Any = None) -> str:
        """A stable, readable name for Flower node ``node``: ``node-P`` when the node reports
        its ``partition-id`` (stable across runs), else ``node-K`` by first sight (K from 1,
        ordered by node id within a round)."""
        if node not in self.node_names:
            if isinstance(reported, int) and not isinstance(reported, bool):
                name = f"node-{reported}"
            else:
                name = f"node-{len(self.node_names) + 1}"
            while name in self.node_names.values():
                name += "b"
            self.node_names[node] = name
        return self.node_names[node]

    def finish(self, status: str = "finished") -> UpdateRun:
        """Record how the audit ended in ``metrics.json`` (``finished``, ``interrupted``,
        ``failed``); returns the run. ``LeakageAudit.start`` calls it; a ServerApp that drives
        the strategy round by round itself calls it at the end, else ``status`` stays
        ``running``."""
        self.run.status = status
        self.run.write(self.out)
        for line in self.run.summary_lines(self.out):
            if line.startswith(("mean PSNR", "LOWER BOUND", "inexact")):
                self.log(line)
        return self.run

    def _not_attacked(self, where: str, reason: str) -> None:
        self.run.warnings.append(f"{where}: not attacked: {reason}")
        self.run.write(self.out)
        self.log(f"warning: {where}: not attacked: {reason}")

    def _audit_update(self, server_round: int, label: str, folder: str,
                      received: ReceivedUpdate, params: dict[str, torch.Tensor],
                      buffers: dict[str, torch.Tensor], warnings: list[str],
                      scorer: Scorer,
                      inexact: Sequence[str] = ()) -> RoundRecord | None:
        """Record ``received`` (``record_only``: None) or attack, score and write it;
        ``inexact``: why the wrapper knows the replay is not the update (beside what the
        protocol itself says, :mod:`~fedleak.harness.federated.replay_fidelity`)."""
        if self.record_only:
            write_round(self.out, folder, received, params, buffers, warnings,
                        self.model_spec, self.info.name, inexact=list(inexact))
            self.log(f"round {server_round}, {label}: recorded")
            return None
        return self._attack(server_round, label, folder, received, params, buffers, warnings,
                            scorer, inexact)

    def _attack(self, server_round: int, label: str, folder: str, received: ReceivedUpdate,
                params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                warnings: list[str],
                scorer: Scorer,
                inexact: Sequence[str] = ()) -> RoundRecord:
        observation = observation_for(self.model, params, buffers, received, self.info,
                                      self.device)
        attack, budget_note, budget = self._budgeted(observation)
        started = time.perf_counter()
        reconstruction = reconstruct_with_progress(
            attack, observation, device=self.device, seed=self.seed + server_round - 1,
            label=f"round {server_round} {label} {self.attack_name}", show=self.show_progress)
        wall = time.perf_counter() - started
        round_dir = self.out / folder
        round_dir.mkdir(parents=True, exist_ok=True)
        images = None
        files = {}
        if reconstruction.has_images:
            images = denormalize(reconstruction.images.detach().cpu(), self.info).clamp(0, 1)
            np.save(round_dir / "reconstruction.npy", images.numpy())
            save_grid(round_dir / "reconstruction.png", images)
            files["reconstruction"] = f"{folder}/reconstruction.png"
        labels = [int(y) for y in reconstruction.labels.cpu().tolist()]
        score, truth, unscored = None, None, None
        if self.score:
            score, truth, unscored = scorer(images, labels, list(reconstruction.padding))
        else:
            unscored = "scoring on the nodes is off"
        entry = round_record(received, reconstruction, score, wall)
        entry.files.update(files)
        entry.warnings += warnings + ([budget_note] if budget_note else [])
        entry.budget = budget
        entry.unscored = unscored
        entry.defenses = None if received.defenses is None else \
            [d.spec() for d in received.defenses]
        if inexact:
            entry.replay = INEXACT
            entry.inexact_reasons = [*inexact, *(entry.inexact_reasons or [])]
        if score is not None and images is not None and truth is not None and score.images:
            matched = torch.stack([images[s.matched_index] for s in score.images])
            save_grid(round_dir / "comparison.png", matched, truth,
                      [f"{s.psnr:.1f} dB" for s in score.images],
                      title=f"mean PSNR {score.mean_psnr:.2f} dB")
            entry.files["comparison"] = f"{folder}/comparison.png"
        self.run.rounds.append(entry)
        self.run.write(self.out)
        if score is not None:
            self.log(f"{label}, " + round_line(server_round, score, wall, entry.privacy,
                                               entry.replay == INEXACT))
        else:
            self.log(f"{label}, round {server_round}: unscored ({unscored}), {wall:.1f} s")
        for reason in entry.inexact_reasons or []:
            self.log(f"{label}, round {server_round}: inexact replay: {reason}")
        return entry

    def _budgeted(self, observation: Observation
                  ) -> tuple[Attack[Observation], str | None, dict[str, float] | None]:
        """The attack to run on ``observation`` within the round's budget
        (:func:`capped_iterations`), a note when its iterations were cut, and the figures."""
        configured = getattr(self.attack.config, "iterations", None)
        if self.budget is None or not isinstance(configured, int):
            return self.attack, None, None
        seconds = max(self.min_budget_s, self.budget * (self._round_seconds or 0.0)) \
            / max(self._round_replies, 1)
        restarts = int(getattr(self.attack.config, "restarts", 1))
        cap = capped_iterations(observation, seconds, restarts, configured)
        figures = {"round_s": round(self._round_seconds or 0.0, 3),
                   "allowed_s": round(seconds, 3), "configured_iterations": configured,
                   "iterations": min(cap, configured)}
        if cap >= configured:
            return self.attack, None, figures
        attack = create_attack(self.attack_name, {**self.options, "iterations": cap})
        return attack, (f"the audit's budget ({self.budget:g} x the round's "
                        f"{self._round_seconds or 0:.1f} s, at least {self.min_budget_s:g} s, "
                        f"over {self._round_replies} replies: {seconds:.1f} s here) cut the "
                        f"attack from {configured} to {cap} iterations; more iterations may "
                        "recover more (budget=None lifts the bound)"), figures

    def _node_score(self, server_round: int, node: int, images: torch.Tensor | None,
                    labels: list[int], *, aggregate: bool = False,
                    padding: list[int] | None = None) -> ScoreAnswer:
        """Ask ``node`` to score the reconstruction (``aggregate``: its own images among the
        reconstruction of several nodes' batches, :mod:`~fedleak.harness.flower.node_scoring`)."""
        if self._grid is None:
            return None, None, "no grid to reach the node (no train round was configured)"
        query = Message(submission_content(server_round, images, labels, aggregate=aggregate,
                                           padding=padding),
                        dst_node_id=node, message_type=SCORE_MESSAGE_TYPE,
                        group_id=str(server_round))
        answers = list(self._grid.send_and_receive([query], timeout=self.score_timeout))
        if not answers:
            return None, None, f"the node did not answer the score query in " \
                               f"{self.score_timeout:g} s"
        answer = answers[0]
        if answer.has_error():
            return None, None, score_error(answer.error.reason or "")
        record = answer.content.metric_records.get(SCORE_METRICS)
        if record is None:
            return None, None, f"the node's answer carries no {SCORE_METRICS} metrics"
        metrics: dict[str, Any] = dict(record)
        score = pb.ScoreResponse()
        if "psnr" in metrics:
            for i, m, p, s, e in zip(metrics["index"], metrics["matched"],
                                     metrics["psnr"], metrics["ssim"], metrics["mse"],
                                     strict=True):
                score.images.add(index=i, matched_index=m, psnr=p, ssim=s, mse=e)
            for image, padded, exact in zip(score.images, metrics.get("padding", []),
                                            metrics.get("exact-index", []), strict=False):
                image.padding, image.exact = bool(padded), int(exact) >= 0
                image.exact_index = max(int(exact), 0)
            score.exact, score.exact_psnr = int(metrics.get("exact", 0)), EXACT_PSNR
            if "successes" in metrics:
                score.successes = int(metrics["successes"])
                score.success_psnr = SUCCESS_PSNR
            if "best-psnr" in metrics:
                score.best_scored, score.best_psnr = True, float(metrics["best-psnr"])
            score.mean_psnr = float(metrics["mean-psnr"])
            score.mean_ssim = float(metrics["mean-ssim"])
            score.mean_mse = float(metrics["mean-mse"])
        if "label-accuracy" in metrics:
            score.labels_scored = True
            score.label_accuracy = float(metrics["label-accuracy"])
        revealed = answer.content.array_records.get(REVEALED)
        truth = tensors(revealed)["images"] if revealed is not None else None
        return score, truth, None


#: ANSI escape sequences (colours) in a Flower error reason
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def score_error(reason: str) -> str:
    """One readable line for a node's error answer to a score query: what to add when it has
    no score handler, else the reason's last line, colours removed."""
    text = ANSI.sub("", reason or "")
    if f"No query function registered with name '{SCORE_ACTION}'" in text:
        return (f"the node's ClientApp has no {SCORE_ACTION!r} query handler: add "
                f"`@app.query(\"{SCORE_ACTION}\")` returning `score_reply(msg, context, info)` "
                "(fedleak.harness.flower.node_scoring), and call `remember_batch` (or fedleak's "
                "`train(..., context=context)`) when training (docs/flower.md)")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "the node refused to score: " + (lines[-1] if lines else "no reason given")


def capped_iterations(observation: Observation, seconds: float, restarts: int,
                      configured: int) -> int:
    """How many iterations of ``restarts`` restarts fit in ``seconds``: one objective
    evaluation (the replay of the user's update with a graph, and one vector–Jacobian product
    back to the images) is timed on random candidates, the median of three, and an iteration
    counted as :data:`LOOP_OVERHEAD` of it (the priors, the optimiser's step); at least 1, at
    most ``configured``."""
    copies = epoch_copies(observation)
    shape = (copies * observation.num_images, *observation.image_shape)
    device = observation.parameters[0].device
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(observation.num_classes, (shape[0],), generator=generator)
    times = []
    for _ in range(3):
        images = torch.randn(shape, generator=generator).to(device).requires_grad_(True)
        started = time.perf_counter()
        update = observation.simulate(images, labels.to(device))
        torch.autograd.grad(torch.stack([(u * u).sum() for u in update]).sum(), images)
        times.append(time.perf_counter() - started)
    per_iteration = sorted(times)[1] * LOOP_OVERHEAD * max(restarts, 1)
    return max(1, min(configured, int(seconds / max(per_iteration, 1e-9))))
