"""What both Flower audits share: the model, the attack, the run folder, and one update's audit.

:class:`~fedleak.harness.flower.audit.LeakageAudit` (every node's reply, Message-API
strategies) and :class:`~fedleak.harness.flower.secagg.AggregateAudit` (the aggregate Flower's
SecAgg+ hands a legacy strategy) differ in what they read off a round; from a
:class:`~fedleak.harness.attacker.client.ReceivedUpdate` on, they are the same
:class:`Auditor`: record it (``record_only``) or build the attack's observation with the
victim's own replay (:func:`~fedleak.harness.attacker.update_attack.observation_for`), run the
attack, have the reconstruction scored on the node(s) that hold the batch
(:mod:`~fedleak.harness.flower.scoring`; the truth stays there) and write the run folder
``fedleak attack`` writes (``metrics.json``, ``reconstruction.png``, ``comparison.png`` where
the nodes reveal).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np
import torch
from flwr.app import Message
from flwr.serverapp import Grid
from torch import nn

from fedleak.attacks import create_attack
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.progress import reconstruct_with_progress
from fedleak.harness.attacker.recording import write_round
from fedleak.harness.attacker.records import RoundRecord, RunHeader, UpdateRun
from fedleak.harness.attacker.settings import jsonable
from fedleak.harness.attacker.update_attack import observation_for, round_line, round_record
from fedleak.harness.flower.arrays import tensors
from fedleak.harness.flower.scoring import (
    REVEALED,
    SCORE_MESSAGE_TYPE,
    SCORE_METRICS,
    submission_content,
)
from fedleak.harness.shared.datasets import DatasetInfo, dataset_info, denormalize
from fedleak.harness.shared.metrics import EXACT_PSNR
from fedleak.harness.shared.models import build_model
from fedleak.harness.shared.pictures import save_grid
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
    [print] takes the audit's lines.
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
        self.out.mkdir(parents=True, exist_ok=True)
        self.run = UpdateRun(RunHeader.now(
            "flower federation", self.model_spec or type(self.model).__name__, self.info.name,
            attack, jsonable(dataclasses.asdict(self.attack.config)),
            {"attack": attack, "options": jsonable(self.options), "seed": seed,
             "record_only": record_only, "score": score, **(settings or {})}, device))
        self.run.write(self.out)
        self._grid: Grid | None = None

    def finish(self, status: str = "finished") -> UpdateRun:
        """Record how the audit ended in ``metrics.json``; returns the run."""
        self.run.status = status
        self.run.write(self.out)
        return self.run

    def _not_attacked(self, where: str, reason: str) -> None:
        self.run.warnings.append(f"{where}: not attacked: {reason}")
        self.run.write(self.out)
        self.log(f"warning: {where}: not attacked: {reason}")

    def _audit_update(self, server_round: int, label: str, folder: str,
                      received: ReceivedUpdate, params: dict[str, torch.Tensor],
                      buffers: dict[str, torch.Tensor], warnings: list[str],
                      scorer: Scorer) -> RoundRecord | None:
        """Record ``received`` (``record_only``: None) or attack, score and write it."""
        if self.record_only:
            write_round(self.out, folder, received, params, buffers, warnings,
                        self.model_spec, self.info.name)
            self.log(f"round {server_round}, {label}: recorded")
            return None
        return self._attack(server_round, label, folder, received, params, buffers, warnings,
                            scorer)

    def _attack(self, server_round: int, label: str, folder: str, received: ReceivedUpdate,
                params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                warnings: list[str],
                scorer: Scorer) -> RoundRecord:
        observation = observation_for(self.model, params, buffers, received, self.info,
                                      self.device)
        started = time.perf_counter()
        reconstruction = reconstruct_with_progress(
            self.attack, observation, device=self.device, seed=self.seed + server_round - 1,
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
        entry.warnings += warnings
        entry.unscored = unscored
        if score is not None and images is not None and truth is not None and score.images:
            matched = torch.stack([images[s.matched_index] for s in score.images])
            save_grid(round_dir / "comparison.png", matched, truth,
                      [f"{s.psnr:.1f} dB" for s in score.images],
                      title=f"mean PSNR {score.mean_psnr:.2f} dB")
            entry.files["comparison"] = f"{folder}/comparison.png"
        self.run.rounds.append(entry)
        self.run.write(self.out)
        if score is not None:
            self.log(f"{label}, " + round_line(server_round, score, wall, entry.privacy))
        else:
            self.log(f"{label}, round {server_round}: unscored ({unscored}), {wall:.1f} s")
        return entry

    def _node_score(self, server_round: int, node: int, images: torch.Tensor | None,
                    labels: list[int], *, aggregate: bool = False,
                    padding: list[int] | None = None) -> ScoreAnswer:
        """Ask ``node`` to score the reconstruction (``aggregate``: its own images among the
        reconstruction of several nodes' batches, :mod:`~fedleak.harness.flower.scoring`)."""
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
            return None, None, f"the node refused to score: {answer.error.reason}"
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
