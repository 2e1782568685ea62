"""Auditing Flower's SecAgg+ rounds: the server, and so the audit, holds only the aggregate.

Flower 1.41 runs SecAgg+ through its legacy workflow API. On the ServerApp,
``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` drives a legacy
``flwr.server.strategy.Strategy``; wrap that strategy in :class:`AggregateAudit`::

    audit = AggregateAudit(FedAvg(...), model="lenet-zhu", dataset="digits", out=Path("runs/a"),
                           secagg=SecAggPlus(shares=3, threshold=2))
    DefaultWorkflow(fit_workflow=audit.secagg.workflow(nodes))(grid, LegacyContext(
        context, config=ServerConfig(num_rounds=3), strategy=audit))

and put ``secaggplus_mod`` (then :class:`~fedleak.harness.flower.secagg.legacy.LegacyLayout`) on the
ClientApp. What the strategy receives (``SecAggPlusWorkflow.unmask_stage``): one ``FitRes`` per
surviving node, each with that node's ``num_examples`` and metrics but all holding the *same*
parameters, the unmasked aggregate

    θ̄′ = Σ_k q_k θ′_k / Σ_k q_k,   q_k = round(n_k / max_weight · Q)

— the nodes' new states weighted by their example counts n_k (to 1/Q of max_weight), each
first clipped to ±clipping_range (after scaling by q_k/Q) and stochastically rounded to
Q = quantization_range levels over that range. The rounding is unbiased and leaves each entry
of θ̄′ within 2·clipping_range·K / Σ_k q_k of the exact weighted mean
(:meth:`~fedleak.harness.flower.secagg.secaggplus_settings.SecAggPlus.error_bound`):
2·clipping_range/Q when max_weight equals the nodes' n, but max_weight/n times more with
Flower's default max_weight = 1000.

The audit keeps θ per round (``configure_fit``), reads the aggregate update
Δ̄ = θ̄′ − θ = Σ_k n_k Δ_k / N (or ḡ = (θ − θ̄′)/τ for one-step FedSGD), and attacks it as
*one* update over the pooled batch of all N = Σ_k n_k images of the K survivors. That replay
is exact when every node took one local step (FedSGD, or FedAvg with one epoch over one
batch): n_k-weighted means of per-node mean gradients are the mean gradient over the pooled
batch (BatchNorm in train mode excepted: each node normalised with its own batch statistics,
which is warned about). After several local steps the aggregate is a mean of K separate
trajectories, which is not one client's update on the pooled batch: such rounds are not
attacked, and the reason is recorded. Each survivor then scores the reconstruction of all N
images against its own batch (it finds its n_k images among them:
:mod:`~fedleak.harness.flower.node.node_scoring`), and the audit pools the scores.

``metrics.json`` says what the server saw: ``server_view`` in the header and in every round
(``secagg+ aggregate of K nodes``), with the survivors, their example counts, the weights and
the quantisation bound under ``aggregate``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Unpack

import torch
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from torch import nn

from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.federated.protocol import FEDSGD, ProtocolError
from fedleak.harness.flower.arrays import mismatch, split_state
from fedleak.harness.flower.auditor import (
    PRIVACY_METRICS,
    AuditOptions,
    Auditor,
    NotAttackable,
    ScoreAnswer,
)
from fedleak.harness.flower.probe import ProbeOutcome
from fedleak.harness.flower.procedure import REPLAYABLE_METRIC, procedure_from_config
from fedleak.harness.flower.secagg.aggregate_probe import AggregateProbe, check_aggregate_probe
from fedleak.harness.flower.secagg.legacy import named_state, parameters_of
from fedleak.harness.flower.secagg.pooled_score import pooled_score
from fedleak.harness.flower.secagg.secaggplus_settings import SecAggPlus
from fedleak.harness.flower.update import update_of
from fedleak.harness.zoo.datasets import DatasetInfo

#: what the server sees under SecAgg+ (metrics.json ``server_view``)
SERVER_VIEW = "secagg+ aggregate of the surviving nodes' updates, never one node's"


class AggregateAudit(Auditor, LegacyStrategy):
    """Attack (or record) the aggregate SecAgg+ hands a legacy strategy each round, as one
    batch of all the survivors' images, then pass the results on (module doc).

    ``secagg`` gives the workflow's settings, for the quantisation bound and the weights
    recorded with every round (None: not recorded). The nodes are reached for scoring
    through the grid their client proxies carry (or ``grid``). ``model``, ``dataset``, ``out``
    and the other keyword arguments (:class:`~fedleak.harness.flower.auditor.AuditOptions`)
    are the :class:`~fedleak.harness.flower.auditor.Auditor`'s.
    """

    def __init__(
        self,
        inner: LegacyStrategy,
        model: str | nn.Module,
        dataset: str | DatasetInfo,
        out: Path,
        *,
        secagg: SecAggPlus | None = None,
        grid: Grid | None = None,
        **audit: Unpack[AuditOptions],
    ) -> None:
        if not isinstance(inner, LegacyStrategy):
            raise TypeError(f"AggregateAudit wraps a legacy strategy (flwr.server.strategy."
                            f"Strategy, which SecAggPlusWorkflow drives); got "
                            f"{type(inner).__module__}.{type(inner).__name__} (wrap a "
                            "Message-API strategy in LeakageAudit)")
        attacks = audit.get("probe")
        if attacks:  # refused before the run folder is claimed
            check_aggregate_probe((attacks,) if isinstance(attacks, str) else tuple(attacks))
            probe_round = audit.get("probe_round")
            if not isinstance(probe_round, int) or probe_round < 1:
                raise ValueError("a probe under SecAgg+ takes one workflow round: give "
                                 "probe_round= the round to probe (one more than the "
                                 "federation trains, ServerConfig(num_rounds=R + 1))")
        self.inner, self.secagg = inner, secagg
        super().__init__(model, dataset, out, **audit, settings={
            "inner_strategy": type(inner).__name__, "server_view": SERVER_VIEW,
            "secagg_plus": dataclasses.asdict(secagg) if secagg else None})
        self._grid = grid
        self.template = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        self._theta: dict[str, torch.Tensor] = {}
        self._configs: dict[int, dict[str, Any]] = {}
        #: the malicious probe under SecAgg+ (:mod:`~fedleak.harness.flower.secagg.aggregate_probe`)
        self.probe: AggregateProbe | None = None
        self.probe_round = audit.get("probe_round")
        self._before_probe: Parameters | None = None
        self._probe_theta: dict[str, torch.Tensor] | None = None
        self._examples: dict[int, int] = {}
        if attacks:
            self.probe = AggregateProbe(self.model, self.info,
                                        (audit.get("probe_options") or {}).get("trap-weights",
                                                                                {}),
                                        audit.get("probe_public"), self.seed, self.device)
            self.run.malicious_probe = self.probe.report
        #: (server round, the surviving node ids) of every aggregate attacked or recorded
        self.audited: list[tuple[int, tuple[int, ...]]] = []
        self.log("SecAgg+: the audit sees only the aggregate of the surviving nodes' updates, "
                 "as the server does, never one node's; it attacks each round's aggregate as "
                 "one batch of all their images")

    # ------------------------------------------------------------------ the legacy Strategy API

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.inner.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        instructions = self.inner.configure_fit(server_round, parameters, client_manager)
        try:
            self._theta = named_state(parameters, self.template)
        except ValueError as err:
            self._theta = {}
            self._not_attacked(f"round {server_round}", f"the global parameters: {err}")
        self._configs = {proxy.node_id: dict(fitins.config) for proxy, fitins in instructions}
        for proxy, _ in instructions:
            self._grid = self._grid or getattr(proxy, "grid", None)
        if self.probe is not None and server_round == self.probe_round:
            return self._probe_instructions(server_round, parameters, instructions)
        return instructions

    def _probe_instructions(self, server_round: int, parameters: Parameters,
                            instructions: list[tuple[ClientProxy, FitIns]]
                            ) -> list[tuple[ClientProxy, FitIns]]:
        """The probe round's instructions: the trapped θ to every node (the honest θ kept to
        return after the round, which so trains nothing)."""
        assert self.probe is not None
        self._before_probe, self._probe_theta = parameters, None
        self._set_phase(f"the malicious-server probe (round {server_round}, under SecAgg+)")
        if not self._theta:
            return instructions
        params, buffers = split_state(self.model, self._theta)
        config = next(iter(self._configs.values()), {})
        try:
            kind = procedure_from_config(config).protocol.update_kind()
        except ProtocolError:
            kind = "delta"
        per_node = max(self._examples.values(), default=1)
        crafted = self.probe.craft(params, buffers, per_node, len(instructions), kind)
        if crafted is None:
            return instructions
        self._probe_theta = {**self._theta, **crafted}
        self._theta = self._probe_theta
        sent = parameters_of(self._probe_theta)
        self.log(f"malicious probe: trap-weights to {len(instructions)} node(s) under SecAgg+, "
                 f"round {server_round} (its aggregate is discarded from training)")
        return [(proxy, FitIns(sent, fitins.config)) for proxy, fitins in instructions]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]
                      ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if self.probe is not None and server_round == self.probe_round:
            self._probe_aggregate(server_round, results, failures)
            return self._before_probe, {}  # the probe round trains nothing
        self.audit_aggregate(server_round, results, failures)
        return self.inner.aggregate_fit(server_round, results, failures)

    def _probe_aggregate(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                         failures: list[Any]) -> None:
        """Attack the probe round's aggregate (when the probe sent its traps) and record it."""
        assert self.probe is not None
        if self._probe_theta is None:
            self.run.write(self.out)
            return
        try:
            received, params, buffers, _, counts = self._received(server_round, results,
                                                                  failures)
        except NotAttackable as err:
            self.probe.report.outcomes.append(ProbeOutcome(
                "trap-weights", "secagg+ aggregate", "failed", str(err)))
            self.run.write(self.out)
            return
        details = {"nodes": [{"node": node, "num_images": n} for node, n in counts.items()],
                   **self._weights(counts)}
        outcome = self.probe.attack_aggregate(
            server_round, received, params, buffers,
            lambda images, labels, padding: self._pooled_score(server_round, counts, images,
                                                                labels, padding, details))
        if outcome.round is not None:
            outcome.round.aggregate = details
        self.log(f"malicious probe: {outcome.line()}")
        self.run.write(self.out)

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.inner.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int,
                           results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
                           ) -> tuple[float | None, dict[str, Scalar]]:
        return self.inner.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters
                 ) -> tuple[float, dict[str, Scalar]] | None:
        return self.inner.evaluate(server_round, parameters)

    # ------------------------------------------------------------------ one aggregate

    def audit_aggregate(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                        failures: list[Any]) -> None:
        """Attack (or record) the round's aggregate; what cannot be is recorded with why."""
        where = f"round {server_round}, secagg+ aggregate"
        try:
            received, params, buffers, warnings, counts = self._received(
                server_round, results, failures)
            details = {"nodes": [{"node": node, "num_images": n} for node, n in counts.items()],
                       **self._weights(counts)}
            view = received.metadata["server_view"]
            self.log(f"round {server_round}: server view: {view} ({received.num_images} "
                     "images); attacking it as one batch")
            entry = self._audit_update(
                server_round, view, f"round-{server_round:03d}-aggregate", received, params,
                buffers, warnings,
                lambda images, labels, padding: self._pooled_score(server_round, counts, images,
                                                                    labels, padding,
                                                          details))
            if entry is not None:
                entry.server_view, entry.aggregate = view, details
                self.run.write(self.out)
            self.audited.append((server_round, tuple(counts)))
        except NotAttackable as err:
            self._not_attacked(where, str(err))
        except Exception as err:  # an attack that fails must not stop the federation
            self._not_attacked(where, f"the attack failed: {type(err).__name__}: {err}")

    def _received(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                  failures: list[Any]
                  ) -> tuple[ReceivedUpdate, dict[str, torch.Tensor], dict[str, torch.Tensor],
                             list[str], dict[int, int]]:
        """The aggregate update, the θ it answers, the replay's warnings and each survivor's
        example count."""
        if not results:
            raise NotAttackable(f"no node's masked update survived ({len(failures)} failures)")
        if not self._theta:
            raise NotAttackable("the round's global parameters were not read (configure_fit)")
        first = results[0][1].parameters
        if any(r.parameters.tensors != first.tensors for _, r in results[1:]):
            raise NotAttackable("the results carry different parameters: these are the nodes' "
                                "own models, not SecAgg+'s aggregate (audit individual replies "
                                "with LeakageAudit)")
        try:
            aggregate = named_state(first, self.template)
        except ValueError as err:
            raise NotAttackable(f"the aggregate: {err}") from None
        problem = mismatch(self._theta, aggregate)
        if problem:
            raise NotAttackable(f"the aggregate is malformed: {problem}")
        counts = {proxy.node_id: fitres.num_examples for proxy, fitres in
                  sorted(results, key=lambda r: r[0].node_id)}
        if any(not isinstance(n, int) or n < 1 for n in counts.values()):
            raise NotAttackable(f"a survivor reports no example count >= 1: {counts}")
        self._examples.update(counts)
        configs = [self._configs.get(node, {}) for node in counts]
        if any(c != configs[0] for c in configs):
            raise NotAttackable("the survivors were sent different train configs: their "
                                "aggregate is no single procedure's update")
        try:
            procedure = procedure_from_config(configs[0])
        except ProtocolError as err:
            raise NotAttackable(f"the train config's procedure: {err}") from None
        protocol = procedure.protocol
        steps = {node: protocol.local_steps(n) for node, n in counts.items()}
        if any(s != 1 for s in steps.values()):
            raise NotAttackable(
                f"the nodes took {sorted(set(steps.values()))} local steps: their aggregate is "
                "the mean of K separate multi-step trajectories, which is not one client's "
                "update on the pooled batch, and fedleak does not replay K trajectories at "
                "once; audit SecAgg+ rounds of one local step (FedSGD, or FedAvg with one "
                "epoch over one batch)")
        warnings = procedure.replay_warnings() + self._survivor_warnings(results, counts)
        params, buffers = split_state(self.model, self._theta)
        total = sum(counts.values())
        pooled = protocol if protocol.kind == FEDSGD else protocol.with_changes({"batch_size": 0})
        view = f"secagg+ aggregate of {len(counts)} node{'s' if len(counts) != 1 else ''}"
        metadata = {"server_view": view, "secagg_survivors": ",".join(map(str, counts)),
                    "images_per_node": ",".join(map(str, counts.values()))}
        dropped = sorted(set(self._configs) - set(counts))
        if dropped:
            metadata["secagg_dropped"] = ",".join(map(str, dropped))
            warnings.append(f"{len(dropped)} sampled node(s) did not survive SecAgg+ "
                            f"({metadata['secagg_dropped']}): their images are not in the "
                            "aggregate")
        for metric, key in PRIVACY_METRICS.items():  # the worst node's accounting
            values = [float(r.metrics[metric]) for _, r in results if metric in r.metrics]
            if values:
                metadata[key] = str(max(values))
        update = update_of(self._theta, aggregate, list(params), protocol)
        received = ReceivedUpdate(round_id=f"{server_round}/aggregate", names=list(params),
                                  update=update, update_kind=protocol.update_kind(),
                                  protocol=pooled, num_images=total, local_steps=1,
                                  metadata=metadata, user_ids=list(counts))
        for warning in warnings:
            self.log(f"warning: round {server_round}, {view}: {warning}")
        return received, params, buffers, warnings, counts

    def _survivor_warnings(self, results: list[tuple[ClientProxy, FitRes]],
                           counts: dict[int, int]) -> list[str]:
        """What makes the pooled replay inexact: nodes with their own loop, BatchNorm in train
        mode over several nodes, parameters near SecAgg+'s clipping range."""
        out = []
        own = sorted(p.node_id for p, r in results if r.metrics.get(REPLAYABLE_METRIC) != 1)
        if own:
            out.append(f"nodes {own} trained with their own loop (no fedleak-replayable "
                       "metric): fedleak cannot check that they followed the configured "
                       "procedure; if they did not, the replay is wrong")
        batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                        for m in self.model.modules())
        procedure = procedure_from_config(self._configs.get(next(iter(counts)), {}))
        if batchnorm and procedure.protocol.batchnorm == "train" and len(counts) > 1:
            out.append("BatchNorm in train mode: each node normalised its batch with its own "
                       "statistics, the pooled replay with the pooled batch's: the replay is "
                       "inexact (batchnorm = eval, or a model without BatchNorm, makes it exact)")
        if self.secagg is not None:
            largest = max(float(t.abs().max()) for t in self._theta.values()
                          if t.numel() and t.is_floating_point())
            reach = self.secagg.clipping_range * self.secagg.max_weight / max(counts.values())
            if largest > reach / 2:
                out.append(f"the model's state (parameters or BatchNorm statistics) reaches "
                           f"{largest:.3g}, over half of the {reach:.3g} beyond which SecAgg+ "
                           "clips a node's weighted state: the aggregate may be clipped "
                           "(raise the clipping range)")
        return out

    def _weights(self, counts: dict[int, int]) -> dict[str, Any]:
        """SecAgg+'s weights and quantisation bound for these survivors (when known)."""
        if self.secagg is None:
            return {"weights": "n_k / N (SecAgg+'s settings not given to the audit)"}
        examples = list(counts.values())
        weights = self.secagg.weights(examples)
        return {"weights": [w / sum(weights) for w in weights],
                "quantization_error_bound": self.secagg.error_bound(examples)}

    def _pooled_score(self, server_round: int, counts: dict[int, int],
                      images: torch.Tensor | None, labels: list[int], padding: list[int],
                      details: dict[str, Any]) -> ScoreAnswer:
        """Every survivor's score of the reconstruction of all N images, pooled
        (:func:`~fedleak.harness.flower.secagg.pooled_score.pooled_score`)."""
        return pooled_score(self._node_score, server_round, counts, images, labels, padding,
                            details)
