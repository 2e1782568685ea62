"""``LeakageAudit``: a Flower strategy wrapper that attacks every node's reply.

Wrap any Message-API strategy (``flwr.serverapp.strategy.Strategy``: FedAvg, FedProx,
FedAdam, ...) on the ServerApp:

    strategy = LeakageAudit(FedAvg(), model="lenet-zhu", dataset="digits", out=Path("runs/f"))
    strategy.start(grid, initial_arrays, num_rounds=3, train_config=ConfigRecord(...))

Per round it keeps the θ each train message carried (``configure_train``), and for every
reply (``aggregate_train``) reads the update the node sent (:mod:`~fedleak.harness.flower.
update`: Δ = θ′ − θ for FedAvg, g = (θ − θ′)/τ for one-step FedSGD), builds the attack's
observation with the victim's own replay (:func:`~fedleak.harness.attacker.update_attack.
observation_for`), runs any fedleak attack with its options, asks the node to score the
reconstruction against the batch it trained on (:mod:`~fedleak.harness.flower.scoring`; the
truth stays on the node) and writes the run folder ``fedleak attack`` writes
(``metrics.json``, ``round-RRR-node-N/reconstruction.png``, ``comparison.png`` where the node
reveals). The replies then go to the inner strategy unchanged: the audit only reads them.

With ``record_only`` it writes a recording instead (:mod:`~fedleak.harness.attacker.recording`)
for ``fedleak attack --from-recording``, so a heavy attack never blocks a round. A reply the
audit cannot attack (a failed node, wrong shapes or dtypes, no ``num-examples``, a procedure
it cannot read) is recorded in ``metrics.json``'s warnings with the reason, and the
federation goes on. Under Flower's SecAgg+ the server only ever holds the aggregate, and so
does the audit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import nn

from fedleak.attacks import create_attack
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.progress import reconstruct_with_progress
from fedleak.harness.attacker.recording import write_round
from fedleak.harness.attacker.records import RunHeader, UpdateRun
from fedleak.harness.attacker.settings import jsonable
from fedleak.harness.attacker.update_attack import observation_for, round_line, round_record
from fedleak.harness.flower.arrays import mismatch, split_state, tensors
from fedleak.harness.flower.procedure import REPLAYABLE_METRIC, procedure_from_config
from fedleak.harness.flower.scoring import (
    REVEALED,
    SCORE_MESSAGE_TYPE,
    SCORE_METRICS,
    submission_content,
)
from fedleak.harness.flower.update import update_of
from fedleak.harness.shared.datasets import DatasetInfo, dataset_info, denormalize
from fedleak.harness.shared.models import build_model
from fedleak.harness.shared.pictures import save_grid
from fedleak.harness.shared.protocol import ProtocolError
from fedleak.v1 import victim_pb2 as pb

#: reply metrics (from fedleak's train helper) that become the round's public metadata
PRIVACY_METRICS = {"epsilon-total": "epsilon_total", "epsilon-round": "epsilon_round",
                   "delta": "delta"}


class NotAttackable(Exception):
    """A reply the audit cannot attack; the message says why (recorded, never raised out)."""


class LeakageAudit(Strategy):
    """Attack (or record) every node's train reply, then pass the replies on (module doc).

    ``model`` is a fedleak model spec (``lenet-zhu``, ``mlp:width=64``) or an ``nn.Module``
    whose state dict is what the federation trains; ``dataset`` names the data set (or is a
    :class:`DatasetInfo`): shape, classes and normalisation are public facts the attack uses.
    """

    def __init__(
        self,
        inner: Strategy,
        model: str | nn.Module,
        dataset: str | DatasetInfo,
        out: Path,
        *,
        attack: str = "inverting-gradients",
        options: Mapping[str, Any] | None = None,
        seed: int = 0,
        device: str = "cpu",
        record_only: bool = False,
        score: bool = True,
        score_timeout: float = 600.0,
        show_progress: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        if not isinstance(inner, Strategy):
            raise TypeError(
                f"LeakageAudit wraps a Message-API strategy (flwr.serverapp.strategy.Strategy, "
                f"e.g. flwr.serverapp.strategy.FedAvg); got {type(inner).__module__}."
                f"{type(inner).__name__}, which is not one (the legacy flwr.server.strategy "
                "classes are not: port the ServerApp to the Message API)")
        self.inner = inner
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
        self.attack_name, self.options = attack, dict(options or {})
        self.attack = create_attack(attack, self.options)
        self.out, self.seed, self.device = Path(out), seed, device
        self.record_only, self.score, self.score_timeout = record_only, score, score_timeout
        self.show_progress, self.log = show_progress, log
        self.out.mkdir(parents=True, exist_ok=True)
        self.run = UpdateRun(RunHeader.now(
            "flower federation", self.model_spec or type(self.model).__name__, self.info.name,
            attack, jsonable(dataclasses.asdict(self.attack.config)),
            {"attack": attack, "options": jsonable(self.options), "seed": seed,
             "record_only": record_only, "score": score, "inner_strategy":
             type(inner).__name__}, device))
        self.run.write(self.out)
        self._grid: Grid | None = None
        self._sent: dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {}
        #: (server round, node id) of every reply attacked or recorded
        self.audited: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ the Strategy API

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._grid = grid
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        self._sent = {}
        copies: dict[int, dict[str, torch.Tensor]] = {}  # one copy of each θ sent
        for message in messages:
            records = message.content.array_records
            configs = message.content.config_records
            theta: dict[str, torch.Tensor] = {}
            if len(records) == 1:
                record = next(iter(records.values()))
                if id(record) not in copies:  # the messages keep every record alive
                    copies[id(record)] = tensors(record)
                theta = copies[id(record)]
            sent_config = dict(next(iter(configs.values()))) if len(configs) == 1 else {}
            self._sent[message.metadata.dst_node_id] = (theta, sent_config)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        for reply in replies:
            self.audit_reply(server_round, reply)
        answered = {reply.metadata.src_node_id for reply in replies}
        for node in sorted(set(self._sent) - answered):
            self._not_attacked(f"round {server_round}, node {node}",
                               "no reply (the node failed or timed out)")
        return self.inner.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()
        what = "records" if self.record_only else f"attacks with {self.attack_name}"
        self.log(f"LeakageAudit {what} every node's reply into {self.out}")

    def finish(self, status: str = "finished") -> UpdateRun:
        """Record how the audit ended in ``metrics.json``; returns the run."""
        self.run.status = status
        self.run.write(self.out)
        return self.run

    # ------------------------------------------------------------------ one reply

    def audit_reply(self, server_round: int, reply: Message) -> None:
        """Attack (or record) one reply; what cannot be is recorded with the reason."""
        node = reply.metadata.src_node_id
        where = f"round {server_round}, node {node}"
        try:
            received, params, buffers, warnings = self._received(server_round, reply)
            folder = f"round-{server_round:03d}-node-{node}"
            if self.record_only:
                write_round(self.out, folder, received, params, buffers, warnings,
                            self.model_spec, self.info.name)
                self.log(f"{where}: recorded")
            else:
                self._attack(server_round, node, folder, received, params, buffers, warnings)
            self.audited.append((server_round, node))
        except NotAttackable as err:
            self._not_attacked(where, str(err))
        except Exception as err:  # an attack that fails must not stop the federation
            self._not_attacked(where, f"the attack failed: {type(err).__name__}: {err}")

    def _not_attacked(self, where: str, reason: str) -> None:
        self.run.warnings.append(f"{where}: not attacked: {reason}")
        self.run.write(self.out)
        self.log(f"warning: {where}: not attacked: {reason}")

    def _received(self, server_round: int, reply: Message
                  ) -> tuple[ReceivedUpdate, dict[str, torch.Tensor], dict[str, torch.Tensor],
                             list[str]]:
        """The update a reply carries, with the θ it answers and the replay's warnings."""
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise NotAttackable(f"the node failed: {reply.error.reason}")
        if node not in self._sent or not self._sent[node][0]:
            raise NotAttackable("no train message with one ArrayRecord (θ) went to this node "
                                "this round")
        theta, config = self._sent[node]
        records = reply.content.array_records
        if len(records) != 1:
            raise NotAttackable(f"the reply carries {len(records)} ArrayRecords; the audit "
                                "reads one (the node's new state θ′)")
        got = tensors(next(iter(records.values())))
        problem = mismatch(theta, got)
        if problem:
            raise NotAttackable(f"the reply is malformed: {problem}")
        metrics: dict[str, Any] = {}
        for record in reply.content.metric_records.values():
            metrics.update(record)
        n = metrics.get("num-examples")
        if not isinstance(n, int) or n < 1:
            raise NotAttackable("the reply's metrics carry no num-examples (an integer >= 1): "
                                "the attack needs the node's batch size n")
        try:
            procedure = procedure_from_config(config)
        except ProtocolError as err:
            raise NotAttackable(f"the train config's procedure: {err}") from None
        protocol = procedure.protocol
        warnings = procedure.replay_warnings()
        if metrics.get(REPLAYABLE_METRIC) != 1:
            warnings.append("the node trained with its own loop (no fedleak-replayable metric): "
                            "fedleak cannot check that it followed the configured procedure "
                            f"({procedure.assumed()}); if it did not, the replay is wrong")
        steps = protocol.local_steps(n)
        reported = metrics.get("fedleak-local-steps")
        if isinstance(reported, int) and reported != steps:
            warnings.append(f"the node reports {reported} local steps; the replay takes {steps}")
        params, buffers = split_state(self.model, theta)
        update = update_of(theta, got, list(params), protocol)
        metadata = {key: str(metrics[m]) for m, key in PRIVACY_METRICS.items() if m in metrics}
        received = ReceivedUpdate(round_id=f"{server_round}/{node}", names=list(params),
                                  update=update, update_kind=protocol.update_kind(),
                                  protocol=protocol, num_images=n, local_steps=steps,
                                  metadata=metadata)
        for warning in warnings:
            self.log(f"warning: round {server_round}, node {node}: {warning}")
        return received, params, buffers, warnings

    def _attack(self, server_round: int, node: int, folder: str, received: ReceivedUpdate,
                params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                warnings: list[str]) -> None:
        observation = observation_for(self.model, params, buffers, received, self.info,
                                      self.device)
        started = time.perf_counter()
        reconstruction = reconstruct_with_progress(
            self.attack, observation, device=self.device, seed=self.seed + server_round - 1,
            label=f"round {server_round} node {node} {self.attack_name}",
            show=self.show_progress)
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
            score, truth, unscored = self._node_score(server_round, node, images, labels)
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
            self.log(f"node {node}, " + round_line(server_round, score, wall, entry.privacy))
        else:
            self.log(f"node {node}, round {server_round}: unscored ({unscored}), {wall:.1f} s")

    def _node_score(self, server_round: int, node: int, images: torch.Tensor | None,
                    labels: list[int]
                    ) -> tuple[pb.ScoreResponse | None, torch.Tensor | None, str | None]:
        """Ask ``node`` to score the reconstruction: (scores, revealed truth, why unscored)."""
        if self._grid is None:
            return None, None, "no grid to reach the node (configure_train was not called)"
        query = Message(submission_content(server_round, images, labels), dst_node_id=node,
                        message_type=SCORE_MESSAGE_TYPE, group_id=str(server_round))
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
            score.mean_psnr = float(metrics["mean-psnr"])
            score.mean_ssim = float(metrics["mean-ssim"])
            score.mean_mse = float(metrics["mean-mse"])
        if "label-accuracy" in metrics:
            score.labels_scored = True
            score.label_accuracy = float(metrics["label-accuracy"])
        revealed = answer.content.array_records.get(REVEALED)
        truth = tensors(revealed)["images"] if revealed is not None else None
        return score, truth, None
