"""Whether the server's replay of a round is the user's update, and why not.

An optimisation attack's figure means "this much leaks" only when its replay of the user's
local update (:mod:`fedleak.harness.federated.local_update`) is the update the user computed. A
replay fedleak *knows* to differ makes the round **inexact**: its figures are a lower bound on
what leaked (the attack inverted a neighbouring function), kept apart from the exact rounds in
every summary and never the headline. Momentum, weight decay and Nesterov are replayed exactly.
What no replay can know:

- the order of a shuffled FedAvg user with several mini-batches per epoch
  (:meth:`~fedleak.harness.federated.protocol.Protocol.order_matters`), when the attack
  replays the images in a fixed order (wrong for every other order), or, as the composed
  attacks do, one copy of the images per epoch (Dimitrov et al. 2022,
  :mod:`fedleak.attacks.optimisation.fedavg.epochs`), which still fixes which labels shared a
  mini-batch and in which order the batches came. The ``fedavg-shuffled`` attack makes the order a
  variable (:mod:`fedleak.attacks.optimisation.fedavg.batch_order`): where the output layer can tell
  the batches apart (momentum weighs the steps differently) the round is **modelled** — "order
  unknown, modelled", a measurement, in the headline beside the exact rounds; where it cannot (plain
  SGD) the order stays a guess and the round inexact;
- a client whose reported number of local steps differs from the replay's.

Other doubts (a procedure assumed because the Flower config did not state it, a client loop
fedleak cannot inspect) are warnings, not known differences: the round stays exact as stated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedleak.attacks.optimisation.fedavg.shuffled import GUESSED as ORDER_GUESSED
from fedleak.attacks.optimisation.fedavg.shuffled import MODELLED as ORDER_SEARCHED
from fedleak.harness.federated.protocol import Protocol

EXACT = "exact"
MODELLED = "modelled"
INEXACT = "inexact"


def replay_status(protocol: Protocol, num_images: int, *,
                  extras: Mapping[str, Any] | None = None) -> tuple[str, list[str]]:
    """How the server's replay relates to the user's update, and why: ``exact`` (no
    reasons), ``modelled`` (the user's order is unknown, and a variable of the attack whose
    replay family holds the user's update: the notes say how) or ``inexact`` (the reasons).
    ``extras`` are the reconstruction's (``epoch_copies``, ``order_model``)."""
    if not protocol.order_matters(num_images):
        return EXACT, []
    batches = protocol.batches_per_epoch(num_images)
    extras = extras or {}
    copies = int(extras.get("epoch_copies", 1))
    shuffled = (f"the user shuffles its {num_images} images into {batches} mini-batches every "
                "epoch in an order the server never sees")
    model = extras.get("order_model")
    if model == ORDER_SEARCHED:
        epochs = f"one copy of the images per epoch ({copies}) and " if copies > 1 else ""
        return MODELLED, [
            f"order unknown, modelled: {shuffled}; the attack replayed {epochs}each epoch's "
            "visiting order as a variable, the batches' label make-up estimated from the output "
            "bias under the steps' momentum weights and kept where the replayed bias came closer "
            "(Dimitrov et al. 2022, extended): the user's update is in the replay's family"]
    if model == ORDER_GUESSED:
        how = ("the attack modelled the order, but the output layer cannot tell the batches "
               "apart (equal step weights: plain SGD; or no output bias), so which labels "
               "shared a mini-batch stayed an even guess")
    elif copies > 1:
        how = (f"the attack replayed one copy of the images per epoch ({copies}, Dimitrov et al. "
               "2022), which cannot know which labels shared a mini-batch nor the batches' order")
    else:
        how = "the attack replayed them in one fixed order"
    return INEXACT, [f"{shuffled}; {how}: the figures are a lower bound"]


def inexact_reasons(protocol: Protocol, num_images: int, *,
                    extras: Mapping[str, Any] | None = None) -> list[str]:
    """Why replaying ``protocol`` over ``num_images`` images cannot be the user's update
    (empty: exact, or the order modelled: :func:`replay_status`)."""
    status, reasons = replay_status(protocol, num_images, extras=extras)
    return reasons if status == INEXACT else []
