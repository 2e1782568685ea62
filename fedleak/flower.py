"""The Flower bridge's public names from a short path.

``from fedleak.flower import LeakageAudit``.

Each name is imported from :mod:`fedleak.harness.flower` when first asked for, so
``import fedleak`` and ``import fedleak.flower`` never import ``flwr``; asking for a name
without flwr installed raises :class:`~fedleak.harness.flower.FlowerMissing`, naming the
install command (``pip install 'fedleak[flower]'``).

- :class:`~fedleak.harness.flower.leakage_audit.LeakageAudit`: wraps a Message-API strategy
  on the ServerApp and attacks (or records) every node's reply;
- :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit`: wraps a legacy strategy
  under Flower's SecAgg+ and attacks the aggregate as one batch;
- :class:`~fedleak.harness.flower.secagg.secaggplus_settings.SecAggPlus`: SecAgg+'s settings,
  checked;
- :class:`~fedleak.harness.flower.secagg.legacy.LegacyLayout`: lets a Message-API ClientApp speak
  SecAgg+'s legacy messages;
- :class:`~fedleak.harness.flower.node.mods.DefenseMod`: fedleak's update-stage defenses as a
  ClientApp mod;
- :func:`~fedleak.harness.flower.node.train.train`: the node's local update (DP-SGD through Opacus
  included);
- :func:`~fedleak.harness.flower.node.batches.remember_batch`: keeps the batch a node trained on for
  scoring (when it trains with its own loop);
- :func:`~fedleak.harness.flower.node.node_scoring.answer_score_queries`: answers the audit's score
  queries outside the ClientApp's mod chain (so Flower's DP mods never see them);
- :func:`~fedleak.harness.flower.node.node_scoring.score_reply` and
  :data:`~fedleak.harness.flower.node.node_scoring.SCORE_ACTION`: scores a reconstruction on the
  node, the ground truth never leaving it;
- :class:`~fedleak.harness.flower.procedure.LocalProcedure`: the clients' local procedure, as
  the server states it to the audit;
- :func:`~fedleak.harness.flower.node.published_defenses.publishing`: publishes a defense chain
  Flower's own DP mods run;
- :class:`~fedleak.harness.flower.federation.FederationSettings`,
  :func:`~fedleak.harness.flower.federation.make_server_app`,
  :func:`~fedleak.harness.flower.federation.make_client_app`: the apps ``fedleak flower`` and
  ``flwr run`` use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedleak.harness.flower.federation import (
        FederationSettings,
        make_client_app,
        make_server_app,
    )
    from fedleak.harness.flower.leakage_audit import LeakageAudit
    from fedleak.harness.flower.node.batches import remember_batch
    from fedleak.harness.flower.node.mods import DefenseMod
    from fedleak.harness.flower.node.node_scoring import (
        SCORE_ACTION,
        answer_score_queries,
        score_reply,
    )
    from fedleak.harness.flower.node.published_defenses import publishing
    from fedleak.harness.flower.node.train import train
    from fedleak.harness.flower.procedure import LocalProcedure
    from fedleak.harness.flower.secagg.aggregate_audit import AggregateAudit
    from fedleak.harness.flower.secagg.legacy import LegacyLayout
    from fedleak.harness.flower.secagg.secaggplus_settings import SecAggPlus

#: each public name and the module of :mod:`fedleak.harness.flower` that defines it
WHERE: dict[str, str] = {
    "LeakageAudit": "leakage_audit",
    "AggregateAudit": "secagg.aggregate_audit",
    "SecAggPlus": "secagg.secaggplus_settings",
    "LegacyLayout": "secagg.legacy",
    "DefenseMod": "node.mods",
    "train": "node.train",
    "remember_batch": "node.batches",
    "score_reply": "node.node_scoring",
    "answer_score_queries": "node.node_scoring",
    "SCORE_ACTION": "node.node_scoring",
    "LocalProcedure": "procedure",
    "publishing": "node.published_defenses",
    "FederationSettings": "federation",
    "make_server_app": "federation",
    "make_client_app": "federation",
}

__all__ = ["SCORE_ACTION", "AggregateAudit", "DefenseMod", "FederationSettings", "LeakageAudit",
           "LegacyLayout", "LocalProcedure", "SecAggPlus", "answer_score_queries",
           "make_client_app", "make_server_app", "publishing", "remember_batch", "score_reply",
           "train"]


def __getattr__(name: str) -> Any:
    """Import the name's module of the Flower bridge on first use (module docstring)."""
    if name not in WHERE:
        raise AttributeError(f"module 'fedleak.flower' has no attribute {name!r}; it offers "
                             f"{', '.join(sorted(WHERE))}")
    module = importlib.import_module(f"fedleak.harness.flower.{WHERE[name]}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *WHERE})
