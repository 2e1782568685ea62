"""The batches a node trained on, kept in its Flower state for the audit's score queries.

:func:`remember_batch` keeps round r's images (on [0, 1]; 8-bit data as uint8, exactly) and
labels in the node's ``Context.state`` beside those of its last ``fedleak-keep-rounds`` rounds
(node config, default :data:`KEEP_ROUNDS`); :func:`held_batch` gives them back to the node's
scorer (:mod:`~fedleak.harness.flower.node.node_scoring`). The truth never leaves the node.

This module is on a ClientApp's import path (``from fedleak.flower import remember_batch``), so
it imports only torch and Flower's records: no attack, defense or scoring code.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from fedleak.harness.flower.arrays import record_of, tensors

#: the node's state records: its training batch of round r (``fedleak.truth.r``) and the
#: rounds it keeps
TRUTH_RECORD = "fedleak.truth"
TRUTH_ROUND = "fedleak.truth-rounds"
#: how many rounds' batches a node keeps for the audit's scoring (node config
#: ``fedleak-keep-rounds``)
KEEP_ROUNDS = 8
#: the node's state record of the score submissions it accepted, per round
SPENT = "fedleak.scored"


def remember_batch(context: Context, server_round: int, images: torch.Tensor,
                   labels: torch.Tensor) -> None:
    """Keep this round's batch (images on [0, 1], labels; text: token ids) in the node's state
    for scoring,
    beside the batches of the node's last ``fedleak-keep-rounds`` (node config, default
    :data:`KEEP_ROUNDS`) rounds: the audit scores after the federation, not between rounds.
    Images that are whole multiples of 1/255 (8-bit data) are kept as uint8, exactly."""
    pixels = images.detach().cpu()
    if pixels.is_floating_point():  # token ids (text) are kept as they are
        pixels = pixels.float()
        levels = pixels * 255
        if bool((levels - levels.round()).abs().max() <= 1e-3) if pixels.numel() else False:
            pixels = levels.round().clamp(0, 255).to(torch.uint8)
    context.state[f"{TRUTH_RECORD}.{server_round}"] = record_of({"images": pixels,
                                                                 "labels": labels})
    kept = [r for r in held_rounds(context) if r != server_round] + [server_round]
    limit = context.node_config.get("fedleak-keep-rounds", KEEP_ROUNDS)
    limit = max(1, limit) if isinstance(limit, int) and not isinstance(limit, bool) \
        else KEEP_ROUNDS
    for old in kept[:-limit]:
        del context.state[f"{TRUTH_RECORD}.{old}"]
    context.state[TRUTH_ROUND] = ConfigRecord({"rounds": kept[-limit:]})


def held_rounds(context: Context) -> list[int]:
    """The rounds whose batch this node keeps, oldest first."""
    record = context.state.get(TRUTH_ROUND)
    rounds = record.get("rounds", []) if isinstance(record, ConfigRecord) else []
    return [int(r) for r in rounds] if isinstance(rounds, list) else []


def held_batch(context: Context, server_round: int) -> dict[str, torch.Tensor] | None:
    """Round ``server_round``'s batch (images float on [0, 1], or token ids; labels), or
    None."""
    record = context.state.get(f"{TRUTH_RECORD}.{server_round}")
    if not isinstance(record, ArrayRecord):
        return None
    truth = tensors(record)
    if truth["images"].dtype == torch.uint8:
        truth["images"] = truth["images"].float() / 255
    return truth
