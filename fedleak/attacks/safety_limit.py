"""A safety time limit that never decides a figure.

When it cuts an attack, the result says ``truncated``.

An attack's budget — the work it may spend before it gives up (iterations, objective
evaluations, sampled sets) — decides what it recovers, so it is counted in work: the same
seed and budget give the same result on an idle machine and on a busy one. Wall clock may
still bound a run, as a *safety* cap against a budget that would take hours, but a run it
stops has not spent its budget and its figure is not a measurement: a busy machine would
round it toward "private".

The contract, for every attack (built in, or a plug-in):

- spend the work budget; check :meth:`SafetyLimit.expired` between units of work (never in a
  way that changes what one unit computes);
- when the limit stopped the work before the budget was spent or the attack finished, set
  :attr:`~fedleak.attacks.observation.Reconstruction.truncated` to a sentence saying what was
  cut (:meth:`SafetyLimit.reason` writes it). Leave it None otherwise — also when the budget
  itself ran out (that *is* the measurement at that budget).

The harness then marks the round ``truncated`` in ``metrics.json`` (the round's ``truncated``
field and the run's ``truncated`` list), on the printed round line and in the summary, and a
sweep point with a truncated round is listed as truncated and left out of its charts, tables
and worst case: never a measurement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: the default safety limit of attacks whose budget is work (seconds): far beyond what their
#: default budgets take on one CPU core, so it cuts only a runaway run
DEFAULT_SAFETY_SECONDS = 3600.0


def check_seconds(seconds: float, option: str = "time-limit") -> float:
    """Return ``seconds`` when it is a positive finite number of seconds.

    Raises
    ------
    ValueError
        Naming ``option``, otherwise.
    """
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{option} must be a positive number of seconds (a safety limit; the "
                         f"budget is counted in work), got {seconds}")
    return seconds


@dataclass
class SafetyLimit:
    """A wall-clock cap started at construction.

    :attr:`cut` records whether it ever stopped work (``clock`` is replaceable for tests).
    """

    seconds: float
    clock: Callable[[], float] = time.perf_counter
    started: float = field(init=False)
    #: whether :meth:`expired` ever answered True
    cut: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        """Start the clock."""
        self.started = self.clock()

    def elapsed(self) -> float:
        """Seconds since the limit started."""
        return self.clock() - self.started

    def left(self) -> float:
        """Seconds left (never below 0)."""
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        """Whether the limit has passed; once it has, the run counts as cut (:attr:`cut`)."""
        if self.elapsed() >= self.seconds:
            self.cut = True
        return self.cut

    def reason(self, spent: str) -> str | None:
        """Return the ``truncated`` sentence when the limit cut the run, else None.

        ``spent`` is the work done against the budget, e.g. ``"1200 of 4000000 sampled sets"``.
        """
        if not self.cut:
            return None
        return (f"the {self.seconds:g} s safety limit stopped the attack after {spent}: not a "
                "measurement (the budget is counted in work; raise the time limit or run "
                "where the machine is less busy)")
