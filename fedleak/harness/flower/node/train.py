"""The node's local update for a ClientApp: fedleak's own, so the audit's replay is exact.

:func:`train` is what a ClientApp's train handler calls for exact-replay experiments: it
reads θ from the train message, runs
:func:`~fedleak.harness.federated.defended_update.defended_update`
(the code fedleak's victim runs: :func:`~fedleak.harness.federated.local_update.local_update`,
or DP-SGD through Opacus when ``defenses`` names ``dpsgd``) on the node's batch with the
procedure of the round's config, and returns the state that carries the update
(:mod:`~fedleak.harness.flower.update`) with the reply's metrics: ``num-examples``,
``fedleak-local-steps``, ``fedleak-replayable`` (the audit's sign that the procedure is
fedleak's) and, under DP-SGD, the accountant's ``epsilon-round``, ``epsilon-total`` (over every
round this node served, kept in the node's Flower state) and ``delta``.

With ``context`` the batch is remembered in the node's state, where the node-side scorer
(:mod:`~fedleak.harness.flower.node.node_scoring`) finds it; it never leaves the node. A ClientApp
with its own training loop still works with the audit, which then warns that it cannot check the
procedure.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from torch import nn

from fedleak.defenses.accounting import epsilon, make_accountant
from fedleak.defenses.chain import build_chain, parse_defense_spec
from fedleak.harness.federated.defended_update import defended_update
from fedleak.harness.flower.arrays import record_of, split_state, tensors
from fedleak.harness.flower.node.batches import (  # noqa: F401  (re-exported)
    KEEP_ROUNDS,
    TRUTH_RECORD,
    TRUTH_ROUND,
    held_batch,
    held_rounds,
    remember_batch,
)
from fedleak.harness.flower.node.published_defenses import publish
from fedleak.harness.flower.procedure import (
    PARTITION_METRIC,
    REPLAYABLE_METRIC,
    procedure_from_config,
)
from fedleak.harness.flower.update import state_carrying
from fedleak.harness.zoo.datasets import DatasetInfo, normalize

#: the node's DP accounting history (its batches: :mod:`~fedleak.harness.flower.node.batches`)
DP_HISTORY = "fedleak.dp-history"


class ParametersRefused(ValueError):
    """A parameter check (``vet``) refused the θ the server sent; the message says why."""


class Trained(tuple[ArrayRecord, MetricRecord]):
    """What :func:`train` returns: ``(arrays, metrics)`` — θ′ and the reply's metrics, as a
    pair, so ``arrays, metrics = train(...)`` works — and :meth:`content`, the reply content
    with the defenses training applied published
    (:mod:`~fedleak.harness.flower.node.published_defenses`)."""

    defenses: list[tuple[str, dict[str, str], str]]

    def __new__(cls, arrays: ArrayRecord, metrics: MetricRecord,
                defenses: list[tuple[str, dict[str, str], str]]) -> Trained:
        out = super().__new__(cls, (arrays, metrics))
        out.defenses = defenses
        return out

    def content(self, arrays: str = "arrays", metrics: str = "metrics") -> RecordDict:
        """The train reply's content: ``{arrays: θ′, metrics: ..., fedleak.defenses: ...}``."""
        out = RecordDict({arrays: self[0], metrics: self[1]})
        publish(out, self.defenses)
        return out


def train(
    model: nn.Module,
    sent: ArrayRecord,
    images: torch.Tensor,
    labels: torch.Tensor,
    info: DatasetInfo,
    config: Mapping[str, Any],
    *,
    defenses: Sequence[str] = (),
    context: Context | None = None,
    generator: torch.Generator | None = None,
) -> Trained:
    """θ′ and the reply's metrics after this node's local update on ``images`` (on [0, 1]);
    ``.content()`` of the result is the reply content, publishing ``defenses``.

    ``defenses`` may name one per-example defense (``dpsgd:...``) and parameter checks
    (``vet``, run on θ and the batch before training: :class:`ParametersRefused` when one
    refuses); update-stage defenses belong in a :class:`~fedleak.harness.flower.node.mods.
    DefenseMod`. Raises ``ValueError`` for a
    procedure fedleak's local update does not implement (an optimiser other than SGD).
    Shuffled batches are drawn in a secret order from ``generator``.
    """
    procedure = procedure_from_config(config)
    if procedure.inexact_reasons(int(images.shape[0])):
        raise ValueError(f"fedleak's local update is SGD (momentum, weight decay, Nesterov); "
                         f"the config asks for optimizer {procedure.optimizer!r}: train with "
                         "your own loop")
    chain = build_chain([parse_defense_spec(spec) for spec in defenses])
    if chain.update or chain.transport is not None:
        raise ValueError("train() runs per-example defenses (dpsgd) and parameter checks "
                         "(vet) only; put update defenses in a DefenseMod and use Flower's "
                         "SecAgg+ for secure aggregation")
    state = tensors(sent)
    params, buffers = split_state(model, state)
    buffers = {k: b.clone() for k, b in buffers.items()}  # local training moves them
    protocol = procedure.protocol
    generator = generator or torch.Generator().manual_seed(secrets.randbits(63))
    x = normalize(images.float() if images.is_floating_point() else images, info)  # text: ids
    for check in chain.parameter_checks:  # vet: before anything is trained on θ
        reason = check.inspect(model, params, buffers, x)
        if reason is not None:
            raise ParametersRefused(f"{reason}; the node refuses to train on these parameters "
                                    f"(defense {check.name})")
    update, metadata = defended_update(model, params, buffers, x, labels, protocol, chain,
                                       generator)
    new_state = {**state_carrying(state, update, list(params), protocol), **buffers}
    metrics: dict[str, Any] = {"num-examples": int(images.shape[0]), REPLAYABLE_METRIC: 1,
                               "fedleak-local-steps": protocol.local_steps(images.shape[0])}
    if "epsilon_round" in metadata:
        metrics.update(_privacy_metrics(metadata, chain.per_example, context))
    if context is not None:
        remember_batch(context, int(config.get("server-round", 0)), images, labels)
        partition = context.node_config.get("partition-id")
        if isinstance(partition, int):
            metrics[PARTITION_METRIC] = partition
    return Trained(record_of(new_state), MetricRecord(metrics), chain.describe())


def _privacy_metrics(metadata: Mapping[str, str], defense: Any, context: Context | None
                     ) -> dict[str, float]:
    """ε of this round and, over every round this node served, ε total (Opacus accountant)."""
    out = {"epsilon-round": float(metadata["epsilon_round"]),
           "epsilon-total": float(metadata["epsilon_total"]), "delta": float(metadata["delta"])}
    sigma = metadata.get("noise_multiplier")  # the declaration's, as the accountant read it
    if context is None or sigma is None:
        return out
    record = context.state.get(DP_HISTORY)
    history: dict[str, Any] = dict(record) if isinstance(record, ConfigRecord) else {}
    steps = [*zip(history.get("sigma", []), history.get("q", []), history.get("steps", []),
                  strict=True),
             (float(sigma), float(metadata["sample_rate"]), int(metadata["dp_steps"]))]
    context.state[DP_HISTORY] = ConfigRecord({"sigma": [float(s[0]) for s in steps],
                                              "q": [float(s[1]) for s in steps],
                                              "steps": [int(s[2]) for s in steps]})
    accountant = make_accountant(metadata.get("accountant", "rdp"))
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in steps]
    out["epsilon-total"] = epsilon(accountant, out["delta"])
    return out
