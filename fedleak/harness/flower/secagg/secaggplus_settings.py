"""Flower's SecAgg+ settings (:class:`SecAggPlus`): shares, reconstruction threshold, the
weights and quantisation of the masked sum, checked before a federation starts, and the bound
they put on how far the unmasked aggregate lies from the exact weighted mean. The audit of that
aggregate is :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.server.workflow import SecAggPlusWorkflow


@dataclass(frozen=True)
class SecAggPlus:
    """Flower's SecAgg+ settings (``SecAggPlusWorkflow``'s, by the same names).

    ``shares``: how many nodes each node's key is shared among (itself included), 0 = every
    node; ``threshold``: shares needed to unmask a node, 0 = a majority of the shares (at
    least 2); ``max_weight``: the largest example count a node may weigh its update by
    (Flower's default 1000; ``fedleak flower simulate`` uses the nodes' batch size, the finest
    quantisation SecAgg+ allows). Parameters are clipped to ±``clipping_range`` and rounded to
    ``quantization_range`` levels; masks live modulo ``modulus_range``.
    """

    shares: int = 0
    threshold: int = 0
    max_weight: float = 1000.0
    clipping_range: float = 8.0
    quantization_range: int = 4194304
    modulus_range: int = 4294967296
    timeout: float | None = None

    def resolved(self, nodes: int) -> tuple[int, int]:
        """(shares, threshold) for a federation of ``nodes``."""
        shares = self.shares or nodes
        return shares, self.threshold or max(2, shares // 2 + 1)

    def check(self, nodes: int, examples: int | None = None) -> None:
        """Raise ``ValueError`` saying what to change when SecAgg+ cannot run (or would
        overflow) for ``nodes`` nodes weighing their updates by ``examples`` examples each."""
        if nodes < 2:
            raise ValueError(f"SecAgg+ needs at least 2 nodes (Flower's SecAggPlusWorkflow "
                             f"refuses fewer); got {nodes}")
        shares, threshold = self.resolved(nodes)
        if not 2 <= shares <= nodes:
            raise ValueError(f"SecAgg+ shares must lie in [2, nodes = {nodes}] (0 = every "
                             f"node); got {shares}")
        if shares < nodes and shares < 3:
            raise ValueError(f"SecAgg+ shares below the node count must be at least 3 (Flower: "
                             f"num_shares > 2); got {shares} of {nodes} nodes")
        if not 2 <= threshold <= shares:
            raise ValueError(f"the SecAgg+ reconstruction threshold must lie in [2, shares = "
                             f"{shares}] (0 = a majority of the shares): a node's masks are "
                             f"rebuilt from that many of its shares; got {threshold}")
        if threshold == shares < nodes:
            raise ValueError(f"with shares ({shares}) below the node count ({nodes}), Flower "
                             "needs a reconstruction threshold below the shares")
        if self.clipping_range <= 0 or self.quantization_range < 2 or self.max_weight <= 0:
            raise ValueError("SecAgg+'s clipping range and max weight must be positive and its "
                             "quantization range at least 2")
        if nodes * self.quantization_range >= self.modulus_range:
            raise ValueError(f"{nodes} nodes x quantization range {self.quantization_range} "
                             f"reaches the modulus {self.modulus_range}: the masked sum would "
                             "wrap around; lower the quantization range")
        if examples is not None and examples > self.max_weight:
            raise ValueError(f"each node weighs its update by its {examples} examples, above "
                             f"SecAgg+'s max weight {self.max_weight:g}: the weights overflow; "
                             f"set the max weight to at least {examples}")

    def workflow(self, nodes: int) -> SecAggPlusWorkflow:
        """Flower's ``SecAggPlusWorkflow`` with these settings for ``nodes`` nodes."""
        self.check(nodes)
        shares, threshold = self.resolved(nodes)
        return SecAggPlusWorkflow(
            1.0 if shares == nodes else shares, threshold, max_weight=self.max_weight,
            clipping_range=self.clipping_range, quantization_range=self.quantization_range,
            modulus_range=self.modulus_range, timeout=self.timeout)

    def weights(self, examples: list[int]) -> list[int]:
        """The integer weights q_k SecAgg+ gives nodes with these example counts."""
        return [round(n / self.max_weight * self.quantization_range) for n in examples]

    def error_bound(self, examples: list[int]) -> float:
        """How far, at most, an entry of the unmasked aggregate lies from the exact weighted
        mean of the nodes' parameters (each node's stochastic rounding: under one level)."""
        return 2 * self.clipping_range * len(examples) / sum(self.weights(examples))
