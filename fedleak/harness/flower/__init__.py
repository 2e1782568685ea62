"""The Flower bridge: fedleak's attacks, defenses and scoring inside a Flower federation.

The only room that imports ``flwr`` (install it with ``pip install 'fedleak[flower]'``):

- :class:`~fedleak.harness.flower.leakage_audit.LeakageAudit` wraps any Message-API strategy on the
  ServerApp, keeps θ per round and attacks (or records) every node's reply;
- :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit` wraps a legacy strategy
  under Flower's SecAgg+ and attacks the only thing the server gets, the aggregate of the surviving
  nodes, as one batch of all their images
  (:class:`~fedleak.harness.flower.secagg.legacy.LegacyLayout` lets the same ClientApp speak
  SecAgg+'s legacy messages);
- :class:`~fedleak.harness.flower.node.mods.DefenseMod` runs fedleak's update-stage defenses as a
  ClientApp mod; :func:`~fedleak.harness.flower.node.train.train` is the node's local update
  (fedleak's own, DP-SGD through Opacus included);
- :func:`~fedleak.harness.flower.node.node_scoring.score_reply` scores a reconstruction on the node
  against the batch it trained on, ground truth never leaving it;
- :mod:`~fedleak.harness.flower.federation` assembles ServerApp and ClientApp for
  ``fedleak flower simulate`` and for ``flwr run``.

Importing this package without flwr raises :class:`FlowerMissing`, naming the install command.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'fedleak[flower]'"


class FlowerMissing(ImportError):
    """flwr is not installed; the message names the command that installs it."""


def require_flwr() -> None:
    """Raise :class:`FlowerMissing` unless ``flwr`` can be imported."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise FlowerMissing(f"the Flower bridge needs flwr, which cannot be imported ({err}): "
                            f"run `{INSTALL_HINT}` (or `pip install -c constraints.txt -e "
                            "'.[flower]'` in a checkout)") from None


require_flwr()
