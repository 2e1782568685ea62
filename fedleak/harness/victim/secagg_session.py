"""The victim's side of secure aggregation: K users, each with its own update, answering the
server's protocol messages one call at a time.

A :class:`SecAggSession` is created by ``BeginSecAgg`` with every user's (already defended)
update flattened in ``Describe`` order; :meth:`SecAggSession.step` answers one user's message
of one phase. A user configured to drop out (``--secagg-drop USER@PHASE``) stops answering from
that phase on, as a real client that went offline — the server must carry on without it.
"""

from __future__ import annotations

import threading

import numpy as np

from fedleak.defenses.secagg import (
    MaskedInputRequest,
    SecAggConfig,
    SecAggError,
    SecAggUser,
    ShareKeysRequest,
    UnmaskingRequest,
    decode_message,
)
from fedleak.defenses.secagg.messages import M
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument, Unavailable

PHASES = ("advertise-keys", "share-keys", "masked-input", "unmasking")
#: Longest refusal of the protocol code quoted in an answer: it lists user ids from the server's
#: message, which a hostile server makes as long as a message may be (an answer longer than
#: gRPC's metadata limit reaches the client as RESOURCE_EXHAUSTED, the reason lost).
REASON_LIMIT = 400


class UserDroppedOut(Unavailable):
    """The user is (simulated) offline: the server sees it as unavailable."""


def parse_drops(specs: list[str] | tuple[str, ...]) -> dict[int, str]:
    """``["2@masked-input"]`` → {2: "masked-input"}: user 2 goes offline at that phase."""
    drops = {}
    for spec in specs:
        user, sep, phase = spec.partition("@")
        if not sep or phase not in PHASES or not user.strip().isdigit():
            raise ValueError(f"--secagg-drop {spec!r} must look like USER@PHASE with PHASE one "
                             f"of {', '.join(PHASES)}")
        drops[int(user)] = phase
    return drops


def server_request(phase: str, message: bytes, kind: type[M]) -> M:
    """The server's message of ``phase``, decoded; another message type is refused."""
    request = decode_message(message)
    if not isinstance(request, kind):
        raise InvalidArgument(f"phase {phase} expects a {kind.__name__}, got "
                              f"{type(request).__name__}")
    return request


class SecAggSession:
    """One secure-aggregation round among the victim's users."""

    def __init__(self, config: SecAggConfig, updates: dict[int, np.ndarray],
                 drops: dict[int, str]) -> None:
        self.config = config
        self.updates = updates
        self.drops = drops
        self.users = {u: SecAggUser(u, config) for u in updates}
        self._lock = threading.Lock()

    def nbytes(self) -> int:
        """Bytes of the updates still kept (each is dropped once its masked input is sent)."""
        with self._lock:
            return sum(u.nbytes for u in self.updates.values())

    def step(self, user_id: int, phase: str, message: bytes) -> bytes:
        """User ``user_id``'s answer in ``phase`` to the server's ``message``."""
        if user_id not in self.users:
            raise InvalidArgument(f"no user {user_id}; this round's users are "
                                  f"{sorted(self.users)}")
        if phase not in PHASES:
            raise InvalidArgument(f"unknown secure-aggregation phase; use one of {PHASES}")
        drop = self.drops.get(user_id)
        if drop is not None and PHASES.index(phase) >= PHASES.index(drop):
            raise UserDroppedOut(f"user {user_id} has dropped out of this round (simulated "
                                 f"from phase {drop}); carry on with the others")
        user = self.users[user_id]
        with self._lock:
            try:
                if phase == "advertise-keys":
                    return user.advertise_keys().to_bytes()
                if phase == "share-keys":
                    return user.share_keys(server_request(phase, message, ShareKeysRequest)) \
                        .to_bytes()
                if phase == "masked-input":
                    request = server_request(phase, message, MaskedInputRequest)
                    update = self.updates.get(user_id)
                    if update is None:
                        raise FailedPrecondition(f"user {user_id} has sent its masked input "
                                                 "of this round already")
                    answer = user.masked_input_collection(request, update).to_bytes()
                    del self.updates[user_id]  # no longer needed: free it
                    return answer
                return user.unmasking(server_request(phase, message, UnmaskingRequest)) \
                    .to_bytes()
            except SecAggError as err:
                raise FailedPrecondition(f"user {user_id} refuses: {_reason(err)}") from err
            except ValueError as err:
                raise InvalidArgument(f"user {user_id} cannot read the message: "
                                      f"{_reason(err)}") from err


def _reason(err: Exception, limit: int = REASON_LIMIT) -> str:
    """``err``'s message, cut to ``limit`` characters with the full length said when cut."""
    text = str(err)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
