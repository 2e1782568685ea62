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
reconstruction against the batch it trained on (:mod:`~fedleak.harness.flower.node.node_scoring`;
the truth stays on the node) and writes the run folder ``fedleak attack`` writes
(``metrics.json``, ``round-RRR-node-N/reconstruction.png``, ``comparison.png`` where the node
reveals). The replies then go to the inner strategy unchanged: the audit only reads them.

By default the attacks run off the round's critical path, in a niced worker process, and the
nodes score them after the federation (:mod:`~fedleak.harness.flower.auditor`); with
``record_only`` it writes a recording instead (:mod:`~fedleak.harness.attacker.recording`) for
``fedleak attack --from-recording``. A reply the
audit cannot attack (a failed node, wrong shapes or dtypes, no ``num-examples``, a procedure
it cannot read) is recorded in ``metrics.json``'s warnings with the reason, and the
federation goes on. Under Flower's SecAgg+ the server only ever holds the aggregate, and so
does the audit: :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit` attacks that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Unpack

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.federated.protocol import ProtocolError
from fedleak.harness.flower.arrays import mismatch, split_state, tensors
from fedleak.harness.flower.audit_end import ended_by
from fedleak.harness.flower.auditor import (
    ORDER_BLIND,
    PRIVACY_METRICS,
    SHUFFLED_ATTACK,
    AuditOptions,
    Auditor,
    NotAttackable,
)
from fedleak.harness.flower.node.published_defenses import CLIPPING_NORM_KEY, published_chain
from fedleak.harness.flower.probe import MaliciousProbe, ProbeSettings
from fedleak.harness.flower.procedure import (
    PARTITION_METRIC,
    REPLAYABLE_METRIC,
    procedure_from_config,
)
from fedleak.harness.flower.update import update_of
from fedleak.harness.zoo.datasets import DatasetInfo


class LeakageAudit(Auditor, Strategy):
    """Attack (or record) every node's train reply, then pass the replies on (module doc).

    ``model``, ``dataset``, ``out`` and the keyword arguments (:class:`~fedleak.harness.flower.
    auditor.AuditOptions`: attack, options, seed, record_only, score, ...) are the
    :class:`~fedleak.harness.flower.auditor.Auditor`'s.
    """

    in_background = True

    def __init__(
        self,
        inner: Strategy,
        model: str | nn.Module,
        dataset: str | DatasetInfo,
        out: Path,
        **audit: Unpack[AuditOptions],
    ) -> None:
        if not isinstance(inner, Strategy):
            raise TypeError(
                f"LeakageAudit wraps a Message-API strategy (flwr.serverapp.strategy.Strategy, "
                f"e.g. flwr.serverapp.strategy.FedAvg); got {type(inner).__module__}."
                f"{type(inner).__name__}, which is not one (the legacy flwr.server.strategy "
                "classes are not: port the ServerApp to the Message API, or, under SecAgg+, "
                "use fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit)")
        self.inner = inner
        probe = ProbeSettings.of(audit.get("probe"), audit.get("probe_options"),
                                 audit.get("probe_public"))
        super().__init__(model, dataset, out, **audit, settings={
            "inner_strategy": type(inner).__name__, "server_view": "every node's update",
            **({"malicious_probe": f"{', '.join(probe.attacks)} in probe rounds after the "
                                   "federation, their updates discarded"} if probe else {})})
        self.probe = probe
        self._sent: dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {}
        #: (server round, node id) of every reply attacked or recorded
        self.audited: list[tuple[int, int]] = []
        #: each node's batch size as its replies state it, and the last round's train config
        self.examples: dict[int, int] = {}
        self._final: dict[str, torch.Tensor] | None = None
        self._last_round = 0

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Flower's ``Strategy.start``, the audit's ``metrics.json`` then saying how it ended:
        ``status`` ``finished`` or ``incomplete`` (with what is missing) after the federation,
        ``interrupted`` / ``stopped`` / ``failed`` with the reason and the phase when it
        stopped early (:mod:`~fedleak.harness.flower.audit_end`)."""
        try:
            result = super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                                   evaluate_config, evaluate_fn)
            self._final = tensors(result.arrays)
        except BaseException as err:
            status, reason = ended_by(err, self.phase)
            if isinstance(err, Exception):
                self.run.warnings.append(f"the federation stopped: {type(err).__name__}: {err}")
            self.finish(status, reason)
            raise
        self.finish()
        return result

    # ------------------------------------------------------------------ the Strategy API

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._grid = grid
        self._last_round = max(self._last_round, server_round)
        self._set_phase(f"round {server_round} of the federation")
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
        self.collect()
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self.collect()  # what the worker finished meanwhile (never waits)
        for reply in sorted(replies, key=lambda r: r.metadata.src_node_id):
            self.audit_reply(server_round, reply)
        answered = {reply.metadata.src_node_id for reply in replies}
        for node in sorted(set(self._sent) - answered):
            self._not_attacked(f"round {server_round}, {self.node_name(node)} (Flower node "
                               f"{node})", "no reply (the node failed or timed out)")
        return self.inner.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()
        what = "records" if self.record_only else f"attacks with {self.attack_name}" + (
            f" ({SHUFFLED_ATTACK} where a client shuffles its batches)"
            if self.attack_name in ORDER_BLIND else "")
        self.log(f"LeakageAudit {what} every node's reply into {self.out}")

    # ------------------------------------------------------------------ the probe

    def sent_to(self, node: int, theta: dict[str, torch.Tensor], config: dict[str, Any]
                ) -> None:
        """Remember the θ and config a (probe) train message took to ``node``."""
        self._sent[node] = (theta, config)

    def _after_federation(self) -> None:
        """The malicious-server probe (:mod:`~fedleak.harness.flower.probe`), when asked for:
        after the honest updates are scored, so the probe rounds' batches never push an honest
        round's out of a node's keeping."""
        if self.probe is None or self._grid is None:
            return
        self._set_phase("the malicious-server probe rounds")
        nodes = {node: (self.node_name(node), n) for node, n in sorted(self.examples.items())}
        last = next(iter(self._sent.values()), ({}, {}))
        state = self._final or last[0]
        config = dict(last[1])
        try:
            procedure = procedure_from_config(config, self.procedure)
            kind = procedure.protocol.update_kind()
        except ProtocolError as err:
            self.log(f"warning: the malicious probe cannot read the procedure: {err}")
            return
        probe = MaliciousProbe(self, self.probe)
        self.run.malicious_probe = probe.report
        probe.run(self._grid, state, config, nodes, self._last_round + 1, kind,
                  (getattr(self.inner, "arrayrecord_key", "arrays"),
                   getattr(self.inner, "configrecord_key", "config")))
        self.run.write(self.out)

    # ------------------------------------------------------------------ one reply

    def audit_reply(self, server_round: int, reply: Message) -> None:
        """Attack (or record) one reply; what cannot be is recorded with the reason."""
        node = reply.metadata.src_node_id
        name = self.node_name(node, _reported_partition(reply))
        where = f"round {server_round}, {name} (Flower node {node})"
        try:
            received, params, buffers, warnings, inexact = self.received(server_round, reply,
                                                                          name)
            norm = self._sent[node][1].get(CLIPPING_NORM_KEY)
            self._audit_update(
                server_round, name, f"round-{server_round:03d}-{name}",
                received, params, buffers, warnings,
                lambda images, labels, padding: self._node_score(server_round, node, images,
                                                                  labels, padding=padding),
                inexact, node=node,
                clipping_norm=float(norm) if isinstance(norm, int | float) else None)
            self.audited.append((server_round, node))
        except NotAttackable as err:
            self._not_attacked(where, str(err))
        except Exception as err:  # an attack that fails must not stop the federation
            self._not_attacked(where, f"the attack failed: {type(err).__name__}: {err}")

    def received(self, server_round: int, reply: Message, name: str
                  ) -> tuple[ReceivedUpdate, dict[str, torch.Tensor], dict[str, torch.Tensor],
                             list[str], list[str]]:
        """The update a reply carries, with the θ it answers, the defenses it publishes, the
        replay's warnings and why the replay is known to differ (empty: exact as stated)."""
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
        self.examples[node] = n
        try:
            procedure = procedure_from_config(config, self.procedure)
        except ProtocolError as err:
            raise NotAttackable(f"the train config's procedure: {err}") from None
        try:
            defenses = published_chain(reply.content)
        except ValueError as err:
            raise NotAttackable(f"the reply's published defenses: {err}") from None
        protocol = procedure.protocol
        warnings = procedure.replay_warnings()
        inexact = procedure.inexact_reasons(n)
        if metrics.get(REPLAYABLE_METRIC) != 1:
            warnings.append("the node trained with its own loop (no fedleak-replayable metric): "
                            "fedleak replays the stated procedure "
                            f"({procedure.assumed()}) and cannot check that the node followed "
                            "it; if it did not, the replay is wrong")
        if defenses is None:
            warnings.append("the reply publishes no defense chain: attacked as undefended "
                            "(a client defense that does not publish itself, e.g. a Flower mod "
                            "not wrapped by fedleak's publishing(), leaves the attack blind)")
        steps = protocol.local_steps(n)
        reported = metrics.get("fedleak-local-steps")
        if isinstance(reported, int) and reported != steps:
            inexact.append(f"the node reports {reported} local steps; the replay takes {steps}")
        params, buffers = split_state(self.model, theta)
        update = update_of(theta, got, list(params), protocol)
        metadata = {key: str(metrics[m]) for m, key in PRIVACY_METRICS.items() if m in metrics}
        received = ReceivedUpdate(round_id=f"{server_round}/{name}", names=list(params),
                                  update=update, update_kind=protocol.update_kind(),
                                  protocol=protocol, num_images=n, local_steps=steps,
                                  metadata=metadata, defenses=defenses)
        for warning in warnings:
            self.log(f"warning: round {server_round}, {name}: {warning}")
        if defenses:
            self.log(f"round {server_round}, {name}: published defenses "
                     f"{', '.join(d.spec() for d in defenses)}")
        return received, params, buffers, warnings, inexact


def _reported_partition(reply: Message) -> Any:
    """The ``fedleak-partition-id`` metric a node's reply reports (fedleak's ``train`` sets it
    from the node config), or None."""
    if reply.has_error():
        return None
    for record in reply.content.metric_records.values():
        if PARTITION_METRIC in record:
            return record[PARTITION_METRIC]
    return None
