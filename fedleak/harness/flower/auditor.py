"""What both Flower audits share: the model, the attack, the run folder, and one update's audit.

:class:`~fedleak.harness.flower.leakage_audit.LeakageAudit` (every node's reply, Message-API
strategies) and :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit` (the
aggregate Flower's SecAgg+ hands a legacy strategy) differ in what they read off a round; from a
:class:`~fedleak.harness.attacker.client.ReceivedUpdate` on, they are the same
:class:`Auditor`: record it (``record_only``) or build the attack's observation with the
victim's own replay (:func:`~fedleak.harness.attacker.update_attack.observation_for`), run the
attack, have the reconstruction scored on the node(s) that hold the batch
(:mod:`~fedleak.harness.flower.node.node_scoring`; the truth stays there) and write the run folder
``fedleak attack`` writes (``metrics.json``, ``reconstruction.png``, ``comparison.png`` where
the nodes reveal).

By default (``background``) the audit never blocks the federation: each update goes to a
niced worker process (:mod:`~fedleak.harness.flower.audit_worker`: bounded queue, the attack's
own budget in objective evaluations, a record when it falls behind or skips), the replies go
on at once, and the nodes score the reconstructions after the federation's last round
(:meth:`Auditor.finish`), each node keeping its batches of the last ``fedleak-keep-rounds``
rounds. ``background=False`` attacks and scores each update in the round, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import torch
from flwr.serverapp import Grid
from torch import nn

from fedleak.attacks import Attack, Observation, create_attack
from fedleak.harness.attacker.attack_settings import jsonable
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.pictures import save_grid, save_reconstruction
from fedleak.harness.attacker.recording import write_round
from fedleak.harness.attacker.records import RoundRecord, RunHeader, UpdateRun
from fedleak.harness.attacker.round_outcome import fill_scores, round_line, round_record
from fedleak.harness.federated.replay_fidelity import INEXACT, MODELLED
from fedleak.harness.flower.audit_end import AuditEnd, watch
from fedleak.harness.flower.audit_options import (  # noqa: F401  (re-exported)
    ORDER_BLIND,
    PRIVACY_METRICS,
    SHUFFLED_ATTACK,
    AuditOptions,
    FolderInUse,
    NotAttackable,
    Scorer,
    claim_folder,
)
from fedleak.harness.flower.audit_worker import (
    DEFAULT_NICE,
    DEFAULT_QUEUE,
    AuditJob,
    AuditResult,
    AuditWorker,
    WorkerUnavailable,
    attack_job,
)
from fedleak.harness.flower.score_answers import (  # noqa: F401  (score_error re-exported)
    ScoreAnswer,
    ask_nodes,
    read_answer,
    score_error,
    score_query,
)
from fedleak.harness.zoo.datasets import DatasetInfo, dataset_info, denormalize
from fedleak.harness.zoo.models import build_model
from fedleak.harness.zoo.user_models import is_factory, user_model


@dataclass
class PendingUpdate:
    """An update handed to the attack whose result is not yet recorded."""

    server_round: int
    label: str
    folder: str
    received: ReceivedUpdate
    warnings: list[str]
    scorer: Scorer | None
    inexact: Sequence[str] = ()
    node: int | None = None
    attack: str = ""
    behind: int = 0
    clipping_norm: float | None = None


class Auditor(AuditEnd):
    """Attack (or record) updates read off a Flower round; write the run folder (module doc).

    ``in_background`` is a wrapper's default for ``background`` (True for every node's reply,
    :class:`~fedleak.harness.flower.leakage_audit.LeakageAudit`; the SecAgg+ aggregate is
    attacked in the round).

    ``model`` is a fedleak model spec (``lenet-zhu``, ``mlp:width=64``), an importable factory
    ``module:factory`` of the user's own ``nn.Module`` (:func:`~fedleak.harness.zoo.
    user_models.user_model`), or an ``nn.Module`` whose state dict is what the federation
    trains; ``dataset`` names the data set (or is a :class:`DatasetInfo`): shape, classes and
    normalisation are public facts the attack uses. ``settings`` go into ``metrics.json``'s
    header beside the attack's; ``audit`` are the :class:`AuditOptions`.
    """

    in_background = False

    def __init__(self, model: str | nn.Module, dataset: str | DatasetInfo, out: Path, *,
                 settings: Mapping[str, Any] | None = None,
                 **audit: Unpack[AuditOptions]) -> None:
        attack = audit.get("attack", "inverting-gradients")
        seed, device = audit.get("seed", 0), audit.get("device", "cpu")
        record_only, score = audit.get("record_only", False), audit.get("score", True)
        self.info = dataset if isinstance(dataset, DatasetInfo) else dataset_info(dataset)
        if isinstance(model, str) and is_factory(model):
            self.model_spec, self.model = "", user_model(model)
            factory = model
        elif isinstance(model, str):
            self.model_spec, factory = model, ""
            self.model = build_model(model, self.info.shape, self.info.num_classes)
        else:
            self.model_spec, self.model, factory = "", model, ""
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
        self.background = audit.get("background", self.in_background) and not record_only
        self.queue, self.nice = audit.get("queue", DEFAULT_QUEUE), audit.get("nice", DEFAULT_NICE)
        self.threads, self.drain_timeout = audit.get("threads", 1), audit.get("drain_timeout")
        if self.queue < 1:
            raise ValueError(f"queue must hold at least 1 update, got {self.queue!r}")
        claim_folder(self.out, audit.get("overwrite", False))
        self.out.mkdir(parents=True, exist_ok=True)
        budget = getattr(self.attack.config, "iterations", None)
        self.run = UpdateRun(RunHeader.now(
            "flower federation", self.model_spec or factory or type(self.model).__name__,
            self.info.name, attack, jsonable(dataclasses.asdict(self.attack.config)),
            {"attack": attack, "options": jsonable(self.options), "seed": seed,
             "record_only": record_only, "score": score,
             "budget": None if budget is None else
             f"{budget} iterations x {getattr(self.attack.config, 'restarts', 1)} restart(s) "
             "per update (objective evaluations), whatever the round's time",
             "audit": (f"off the round's critical path: a worker process niced +{self.nice} "
                       "over the nodes' processes (past 19: SCHED_IDLE), "
                       f"{self.threads} torch thread(s), at most {self.queue} update(s) "
                       "waiting; scored on the nodes after the federation")
             if self.background else "in the round (background=False)",
             "stated_procedure": None if self.procedure is None else
             self.procedure.assumed(), **(settings or {})}, device))
        self.run.write(self.out)
        self._grid: Grid | None = None
        #: readable names of the nodes seen, by Flower node id (stable within a run)
        self.node_names: dict[int, str] = {}
        self._worker: AuditWorker | None = None
        self._pending: dict[tuple[int, int], PendingUpdate] = {}
        self._to_score: list[tuple[PendingUpdate, RoundRecord, torch.Tensor | None,
                                   list[int], list[int]]] = []
        self._count = 0
        #: the audit ended (its status written); what the report misses, and the phase now
        self.ended = False
        self._missing: list[str] = []
        self.phase = "starting the federation"
        watch(self, lambda: self.phase)
        if self.background:  # started now, while the federation starts: not in a round
            self._start_worker()

    def node_name(self, node: int, reported: Any = None) -> str:
        """A stable, readable name for Flower node ``node``: ``node-P`` when the node reports
        its ``partition-id`` (stable across runs), else ``node-K`` by first sight (K from 1,
        ordered by node id within a round); ``metrics.json`` adds the partition each node
        states when it scores."""
        if node not in self.node_names:
            if isinstance(reported, int) and not isinstance(reported, bool):
                name = f"node-{reported}"
            else:
                name = f"node-{len(self.node_names) + 1}"
            while name in self.node_names.values():
                name += "b"
            self.node_names[node] = name
        return self.node_names[node]

    def _not_attacked(self, where: str, reason: str) -> None:
        self.run.warnings.append(f"{where}: not attacked: {reason}")
        self.run.write(self.out)
        self.log(f"warning: {where}: not attacked: {reason}")

    def _audit_update(self, server_round: int, label: str, folder: str,
                      received: ReceivedUpdate, params: dict[str, torch.Tensor],
                      buffers: dict[str, torch.Tensor], warnings: list[str],
                      scorer: Scorer | None, inexact: Sequence[str] = (), *,
                      node: int | None = None, clipping_norm: float | None = None
                      ) -> RoundRecord | None:
        """Record ``received`` (``record_only``: None), or attack it — in the worker
        (``background`` and a ``node`` to score it later: None now, recorded when done) or
        here, scoring it with ``scorer`` — and write it; ``inexact``: why the wrapper knows the
        replay is not the update (beside what the protocol says,
        :mod:`~fedleak.harness.federated.replay_fidelity`)."""
        if self.record_only:
            write_round(self.out, folder, received, params, buffers, warnings,
                        self.model_spec, self.info.name, inexact=list(inexact))
            self.log(f"round {server_round}, {label}: recorded")
            return None
        attack = self.attack_for(received)
        if attack != self.attack_name:
            warnings = [*warnings, f"attacked with {attack} (the client shuffles its batches: "
                        f"the order is modelled) instead of {self.attack_name}, same options"]
        self._count += 1
        key = (server_round, self._count)
        pending = PendingUpdate(server_round, label, folder, received, warnings, scorer,
                                inexact, node, attack, clipping_norm=clipping_norm)
        worker = self._start_worker() if self.background and node is not None else None
        job = AuditJob(key, received, params, buffers, attack, self.options,
                       self.seed + server_round - 1,
                       pictures=None if worker is None else self.out / folder)  # drawn there
        if worker is None:
            self._pending[key] = pending
            bar = f"round {server_round} {label} {attack}" if self.show_progress else None
            return self._complete(attack_job(self.model, self.info, self.device, job, bar))
        ahead = worker.submit(job)
        if ahead is None:
            self._not_attacked(f"round {server_round}, {label}",
                               f"skipped: the audit is {self.queue} update(s) behind (its queue "
                               "is full); raise queue= or lower iterations")
            return None
        pending.behind = ahead
        self._pending[key] = pending
        if ahead:
            self.log(f"round {server_round}, {label}: queued behind {ahead} update(s)")
        return None

    def attack_for(self, received: ReceivedUpdate) -> str:
        """The attack for ``received``: :data:`SHUFFLED_ATTACK` for a shuffling client's
        update when the configured attack replays a fixed order, else the configured one."""
        if self.attack_name in ORDER_BLIND and \
                received.protocol.order_matters(received.num_images):
            return SHUFFLED_ATTACK
        return self.attack_name

    def _start_worker(self) -> AuditWorker | None:
        """The worker process, started at the first update (None: attack here, and why)."""
        if self._worker is None:
            try:
                self._worker = AuditWorker(self.model, self.info, self.device, queue=self.queue,
                                           nice=self.nice, threads=self.threads)
            except WorkerUnavailable as err:
                self.run.warnings.append(f"attacking in the ServerApp's process: {err}")
                self.background = False
                return None
        return self._worker

    def collect(self) -> None:
        """Record the worker's results that are in (without waiting)."""
        if self._worker is not None:
            for result in self._worker.results():
                self._complete(result)

    def _complete(self, result: AuditResult) -> RoundRecord | None:
        """Record one attack's result: files, ``metrics.json`` entry, and its score — now
        (inline) or after the federation (background)."""
        pending = self._pending.pop(result.key)
        where = f"round {pending.server_round}, {pending.label}"
        reconstruction = result.reconstruction
        if reconstruction is None:
            if result.lost:
                self._missing.append(f"{where}: {result.error}")
            self._not_attacked(where, f"the attack failed: {result.error}")
            return None
        round_dir = self.out / pending.folder
        round_dir.mkdir(parents=True, exist_ok=True)
        images = None
        files = {}
        if reconstruction.has_images:
            images = denormalize(reconstruction.images.detach().cpu(), self.info).clamp(0, 1)
            if not result.drawn:  # the worker draws its own (seconds for a large batch)
                save_reconstruction(round_dir, images)
            files["reconstruction"] = f"{pending.folder}/reconstruction.png"
        labels = [int(y) for y in reconstruction.labels.cpu().tolist()]
        entry = round_record(pending.received, reconstruction, None, result.wall_s)
        entry.files.update(files)
        entry.warnings += pending.warnings
        entry.defenses = None if pending.received.defenses is None else \
            [d.spec() for d in pending.received.defenses]
        entry.budget = {"iterations_asked": float(_asked(self.attack)),
                        "iterations": float(reconstruction.iterations),
                        "queued_behind": float(pending.behind)}
        if pending.inexact:
            entry.replay, entry.replay_model = INEXACT, None
            entry.inexact_reasons = [*pending.inexact, *(entry.inexact_reasons or [])]
        if pending.node is not None:
            entry.node = f"{pending.label} (Flower node {pending.node})"
        self.run.rounds.append(entry)
        padding = list(reconstruction.padding)
        if self.background and pending.node is not None and self.score:
            entry.unscored = "pending: the node scores it after the federation"
            self._to_score.append((pending, entry, images, labels, padding))
            self.run.write(self.out)
            self.log(f"{pending.label}, round {pending.server_round}: attacked "
                     f"({reconstruction.iterations} of {_asked(self.attack)} iterations, "
                     f"{result.wall_s:.1f} s in the worker); scored after the federation")
            return entry
        answer: ScoreAnswer = (None, None, "scoring on the nodes is off")
        if self.score and pending.scorer is not None:
            answer = pending.scorer(images, labels, padding)
        self._scored(pending, entry, images, answer)
        return entry

    def _score_pending(self) -> None:
        """Have every node score its attacked updates (one message per node and round, all
        sent at once) and record the answers."""
        todo = list(self._to_score)  # cleared when answered: a stop meanwhile marks them
        if not todo:
            return
        if self._grid is None:
            for pending, entry, images, _, _ in todo:
                self._scored(pending, entry, images, (None, None, "no grid to reach the node"))
            self._to_score = []
            return
        queries = [score_query(p.server_round, p.node or 0, images, labels, padding=padding,
                               clipping_norm=p.clipping_norm)
                   for p, _, images, labels, padding in todo]
        try:
            answers = ask_nodes(self._grid, queries, self.score_timeout)
        except Exception as err:  # the grid failed: every round unscored, with the reason
            for pending, entry, images, _, _ in todo:
                self._scored(pending, entry, images, (None, None, f"the score queries failed: "
                                                                  f"{type(err).__name__}: {err}"))
            self._to_score = []
            return
        for pending, entry, images, _, _ in todo:
            answer, partition = read_answer(
                answers.get((pending.node or 0, str(pending.server_round))), self.score_timeout)
            entry.partition = partition
            self._scored(pending, entry, images, answer)
        self._to_score = []

    def _scored(self, pending: PendingUpdate, entry: RoundRecord, images: torch.Tensor | None,
                answer: ScoreAnswer) -> None:
        """Put a node's answer into ``entry`` (scores, comparison picture) and log the line."""
        score, truth, unscored = answer
        fill_scores(entry, score)
        entry.unscored = unscored
        if score is not None and images is not None and truth is not None and score.images:
            matched = torch.stack([images[s.matched_index] for s in score.images])
            save_grid(self.out / pending.folder / "comparison.png", matched, truth,
                      [f"{s.psnr:.1f} dB" for s in score.images],
                      title=f"mean PSNR {score.mean_psnr:.2f} dB")
            entry.files["comparison"] = f"{pending.folder}/comparison.png"
        self.run.write(self.out)
        used = (entry.iterations, _asked(self.attack))
        if score is not None:
            self.log(f"{pending.label}, " + round_line(
                pending.server_round, score, entry.wall_time_s, entry.privacy,
                entry.replay == INEXACT, modelled=entry.replay == MODELLED, iterations=used,
                truncated=entry.truncated))
        else:
            self.log(f"{pending.label}, round {pending.server_round}: unscored ({unscored}), "
                     f"{used[0]} of {used[1]} iterations, {entry.wall_time_s:.1f} s")
        for reason in entry.inexact_reasons or []:
            self.log(f"{pending.label}, round {pending.server_round}: inexact replay: {reason}")

    def _node_score(self, server_round: int, node: int, images: torch.Tensor | None,
                    labels: list[int], *, aggregate: bool = False,
                    padding: list[int] | None = None) -> ScoreAnswer:
        """Ask ``node`` now to score the reconstruction (``aggregate``: its own images among
        the reconstruction of several nodes' batches, :mod:`~fedleak.harness.flower.
        node_scoring`)."""
        if self._grid is None:
            return None, None, "no grid to reach the node (no train round was configured)"
        query = score_query(server_round, node, images, labels, aggregate=aggregate,
                            padding=padding)
        answers = ask_nodes(self._grid, [query], self.score_timeout)
        answer, _ = read_answer(next(iter(answers.values()), None), self.score_timeout)
        return answer


def _asked(attack: Attack[Observation]) -> int:
    """The iterations an attack is asked for (× restarts): its budget in objective
    evaluations."""
    config = attack.config
    return int(getattr(config, "iterations", 0)) * int(getattr(config, "restarts", 1) or 1)
