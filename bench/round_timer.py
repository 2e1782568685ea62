"""Each Flower round's wall time, from the train messages sent to the replies aggregated.

:func:`timed_rounds` wraps ``FedAvg.configure_train`` (the clock starts) and
``FedAvg.aggregate_train`` (the round's seconds are appended) for as long as the ``with`` block
runs, in the process that runs the ServerApp (the benches' own, or Flower's simulation engine
whose ServerApp shares the bench's process); a ``LeakageAudit`` around FedAvg is inside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def timed_rounds() -> Iterator[list[float]]:
    """The list each round's seconds are appended to while the block runs."""
    from flwr.serverapp.strategy import FedAvg

    times: list[float] = []
    started = {"t": 0.0}
    configure, aggregate = FedAvg.configure_train, FedAvg.aggregate_train

    def timed_configure(self: Any, *a: Any, **k: Any) -> Any:
        started["t"] = time.perf_counter()
        return configure(self, *a, **k)

    def timed_aggregate(self: Any, *a: Any, **k: Any) -> Any:
        result = aggregate(self, *a, **k)
        times.append(time.perf_counter() - started["t"])
        return result

    FedAvg.configure_train, FedAvg.aggregate_train = timed_configure, timed_aggregate
    try:
        yield times
    finally:
        FedAvg.configure_train, FedAvg.aggregate_train = configure, aggregate
