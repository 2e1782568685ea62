"""What the victim remembers of the rounds it served, and for how long.

A :class:`Round` records which private images each user trained on (so ``Score`` and ``Reveal``
can find the truth without it ever leaving), the protocol of that round, the secure-aggregation
session when there is one, and — for the latest rounds only — the parameters the server sent,
which scoring recovered features needs (the true layer inputs are recomputed at them).
:class:`RoundBook` keeps the last :data:`MAX_REMEMBERED_ROUNDS` rounds, and their parameters
for at most :data:`FEATURE_ROUNDS` rounds within ``feature_bytes`` (``--feature-memory-mb``; the
newest always). Secure-aggregation rounds keep every user's update until that user has sent its
masked input; their sessions are kept within ``secagg_bytes`` (``--secagg-memory-mb``): the
oldest sessions are forgotten to make room for a new one (their later steps are refused with
``RESOURCE_EXHAUSTED`` naming the flag), and a round that alone needs more than the budget is
refused before any computation. A flood of unfinished rounds therefore holds at most the
budget, and never locks an honest server out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.secagg_session import SecAggSession
from fedleak.harness.wire.request_errors import NotFound, ResourceExhausted, quoted

MAX_REMEMBERED_ROUNDS = 4096
#: The round's parameters are kept (for scoring recovered features) for this many latest rounds.
FEATURE_ROUNDS = 16
#: At most this many bytes of remembered round parameters (the latest round is always kept):
#: a ResNet-152's parameters are 240 MB, sixteen of them would be 3.8 GB.
FEATURE_BYTES = 512 << 20
#: Default bytes of secure-aggregation state kept (``--secagg-memory-mb``).
SECAGG_BYTES = 1024 << 20


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
    secagg_forgotten: bool = False


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class RoundBook:
    """The victim's remembered rounds, by round id (thread-safe)."""

    def __init__(self, feature_bytes: int = FEATURE_BYTES,
                 secagg_bytes: int = SECAGG_BYTES) -> None:
        self.feature_bytes = feature_bytes
        self.secagg_bytes = secagg_bytes
        self._rounds: OrderedDict[str, Round] = OrderedDict()
        self._lock = threading.Lock()

    def check_secagg(self, nbytes: int, users: int, values: int) -> None:
        """Refuse (``RESOURCE_EXHAUSTED``) a secure-aggregation round that alone would keep
        more than the budget: ``users`` updates of ``values`` float64 values."""
        if nbytes > self.secagg_bytes:
            raise ResourceExhausted(
                f"a secure-aggregation round of this victim keeps {users} users' updates of "
                f"{values} values ({_mib(nbytes)}), more than its budget of "
                f"{_mib(self.secagg_bytes)} (--secagg-memory-mb); raise it, or use fewer "
                "--users or a smaller model")

    def secagg_bytes_kept(self) -> int:
        with self._lock:
            return sum(r.secagg.nbytes() for r in self._rounds.values() if r.secagg is not None)

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
                size = tensor_bytes(remembered.parameters)
                kept_rounds, kept_bytes = kept_rounds + 1, kept_bytes + size
                if kept_rounds > 1 and (kept_rounds > FEATURE_ROUNDS
                                        or kept_bytes > self.feature_bytes):
                    remembered.parameters = remembered.buffers = None
            self._forget_secagg()

    def _forget_secagg(self) -> None:
        """Drop the oldest secure-aggregation sessions until those kept fit the budget (the
        newest is kept: :meth:`check_secagg` refused it if it alone did not fit)."""
        sessions = [r for r in self._rounds.values() if r.secagg is not None]
        kept = sum(r.secagg.nbytes() for r in sessions if r.secagg is not None)
        for old in sessions[:-1]:
            if kept <= self.secagg_bytes:
                break
            assert old.secagg is not None
            kept -= old.secagg.nbytes()
            old.secagg, old.secagg_forgotten = None, True

    def get(self, round_id: str) -> Round:
        """The round ``round_id``; ``NOT_FOUND`` naming what to send when it is unknown."""
        with self._lock:
            found = self._rounds.get(round_id)
        if found is None:
            raise NotFound(f"unknown round id {quoted(round_id)}: use a round_id that "
                           f"ComputeUpdate or BeginSecAgg returned (the victim remembers the last "
                           f"{MAX_REMEMBERED_ROUNDS}), or a release_id of Release")
        return found


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
