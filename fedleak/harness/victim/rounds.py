"""What the victim remembers of the rounds it served, and for how long.

A :class:`Round` records which private images each user trained on (so ``Score`` and ``Reveal``
can find the truth without it ever leaving), the protocol of that round, the secure-aggregation
session when there is one, and — for the latest rounds only — the parameters the server sent,
which scoring recovered features needs (the true layer inputs are recomputed at them).
:class:`RoundBook` keeps the last :data:`MAX_REMEMBERED_ROUNDS` rounds, and their parameters
for at most :data:`FEATURE_ROUNDS` rounds within :data:`FEATURE_BYTES` (the newest always).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from fedleak.harness.shared.protocol import Protocol
from fedleak.harness.victim.secure_aggregation import SecAggSession
from fedleak.harness.wire.errors import NotFound, quoted

MAX_REMEMBERED_ROUNDS = 4096
#: The round's parameters are kept (for scoring recovered features) for this many latest rounds.
FEATURE_ROUNDS = 16
#: At most this many bytes of remembered round parameters (the latest round is always kept):
#: a ResNet-152's parameters are 240 MB, sixteen of them would be 3.8 GB.
FEATURE_BYTES = 512 << 20


@dataclass
class Round:
    """What the victim remembers of a round: which private images each user used."""

    round_id: str
    indices: torch.Tensor
    protocol: Protocol
    user_indices: dict[int, torch.Tensor] = field(default_factory=dict)
    secagg: SecAggSession | None = None
    parameters: dict[str, torch.Tensor] | None = None
    buffers: dict[str, torch.Tensor] | None = None


class RoundBook:
    """The victim's remembered rounds, by round id (thread-safe)."""

    def __init__(self) -> None:
        self._rounds: OrderedDict[str, Round] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, round_: Round) -> None:
        """Keep ``round_``; forget the oldest rounds, and old rounds' parameters, past the caps."""
        with self._lock:
            self._rounds[round_.round_id] = round_
            while len(self._rounds) > MAX_REMEMBERED_ROUNDS:
                self._rounds.popitem(last=False)
            kept_rounds = kept_bytes = 0
            for remembered in reversed(self._rounds.values()):  # newest first
                if remembered.parameters is None:
                    continue
                size = sum(t.numel() * t.element_size() for t in remembered.parameters.values())
                kept_rounds, kept_bytes = kept_rounds + 1, kept_bytes + size
                if kept_rounds > 1 and (kept_rounds > FEATURE_ROUNDS
                                        or kept_bytes > FEATURE_BYTES):
                    remembered.parameters = remembered.buffers = None

    def get(self, round_id: str) -> Round:
        """The round ``round_id``; ``NOT_FOUND`` naming what to send when it is unknown."""
        with self._lock:
            found = self._rounds.get(round_id)
        if found is None:
            raise NotFound(f"unknown round id {quoted(round_id)}: use a round_id that "
                           f"ComputeUpdate or BeginSecAgg returned (the victim remembers the last "
                           f"{MAX_REMEMBERED_ROUNDS}), or a release_id of Release")
        return found
