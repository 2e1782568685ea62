"""A victim stopped during secure aggregation is named as such, not read as every user's
dropout ("only 0 users left")."""

from __future__ import annotations

import grpc
import pytest

from fedleak.harness.attacker.client import VictimError
from fedleak.harness.attacker.secagg_rounds import _victim_gone

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class _Client:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def describe(self) -> object:
        if not self.alive:
            raise VictimError(UNAVAILABLE, "failed to connect to all addresses")
        return object()


def test_a_victim_that_no_longer_answers_is_named() -> None:
    last = VictimError(UNAVAILABLE, "Socket closed")
    with pytest.raises(VictimError, match="stopped answering during secure aggregation's "
                                          "masked-input phase.*not a dropout"):
        _victim_gone(_Client(alive=False), "masked-input", last)  # type: ignore[arg-type]
    _victim_gone(_Client(alive=True), "masked-input", last)  # type: ignore[arg-type]  # dropouts
