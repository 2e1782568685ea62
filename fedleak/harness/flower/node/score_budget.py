"""A node's score budget, counted in its Flower state.

:class:`NodeBudget` is the victim's :class:`~fedleak.harness.victim.scoring.budget.ScoreBudget`
whose accepted spends are also counted in the node's ``Context.state``, which outlives the
ClientApp object (a new one may serve every message): at most ``fedleak-score-budget``
submissions per round over the node's whole life. Imported when the first score query is
scored, never on the ClientApp's import path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ConfigRecord, Context

from fedleak.harness.flower.node.batches import SPENT
from fedleak.harness.victim.scoring.budget import ScoreBudget


class NodeBudget(ScoreBudget):
    """:class:`ScoreBudget` counted in the node's state (module docstring)."""

    def __init__(self, context: Context, limit: int) -> None:
        super().__init__(max(1, limit))
        self.context = context

    def recorded(self, server_round: int) -> int:
        """The submissions this node accepted for ``server_round`` so far."""
        spent = self.context.state.get(SPENT)
        if not isinstance(spent, ConfigRecord):
            return 0
        count = spent.get(str(server_round), 0)
        return count if isinstance(count, int) else 0

    def spend(self, target: Any, what: str, images: Iterable[int] = ()) -> None:
        """Spend one of ``target``'s budget and record it in the node's state."""
        super().spend(target, f"round {target[1]} of this node", images)
        server_round = int(target[1])
        self.context.state[SPENT] = ConfigRecord({str(server_round):
                                                  self.recorded(server_round) + 1})
