"""Whether the server's replay of a round is the user's update, and why not.

An optimisation attack's figure means "this much leaks" only when its replay of the user's
local update (:mod:`fedleak.harness.federated.local_update`) is the update the user computed. A
replay fedleak *knows* to differ makes the round **inexact**: its figures are a lower bound on
what leaked (the attack inverted a neighbouring function), kept apart from the exact rounds in
every summary and never the headline. Momentum, weight decay and Nesterov are replayed exactly.
What no replay can know:

- the order of a shuffled FedAvg user with several mini-batches per epoch
  (:meth:`~fedleak.harness.federated.protocol.Protocol.order_matters`): the attack then either
  replays the images in a fixed order (wrong for every other order), or, as the composed
  attacks do, one copy of the images per epoch (Dimitrov et al. 2022,
  :mod:`fedleak.attacks.epochs`), which still fixes which labels shared a mini-batch and in
  which order the batches came;
- a client whose reported number of local steps differs from the replay's.

Other doubts (a procedure assumed because the Flower config did not state it, a client loop
fedleak cannot inspect) are warnings, not known differences: the round stays exact as stated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedleak.harness.federated.protocol import Protocol

EXACT = "exact"
INEXACT = "inexact"


def inexact_reasons(protocol: Protocol, num_images: int, *,
                    extras: Mapping[str, Any] | None = None) -> list[str]:
    """Why replaying ``protocol`` over ``num_images`` images cannot be the user's update
    (empty: exact). ``extras`` are the reconstruction's (``epoch_copies`` when the attack
    replayed one copy per epoch)."""
    if not protocol.order_matters(num_images):
        return []
    batches = protocol.batches_per_epoch(num_images)
    copies = int((extras or {}).get("epoch_copies", 1))
    how = (f"the attack replayed one copy of the images per epoch ({copies}, Dimitrov et al. "
           "2022), which cannot know which labels shared a mini-batch nor the batches' order"
           if copies > 1 else "the attack replayed them in one fixed order")
    return [f"the user shuffles its {num_images} images into {batches} mini-batches every "
            f"epoch in an order the server never sees; {how}: the figures are a lower bound"]
