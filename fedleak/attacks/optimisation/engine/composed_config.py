"""The options every optimisation attack has (:class:`ComposedConfig`), checked when set.

A composed attack is eq. (1) of :mod:`fedleak.attacks.optimisation.composed` with named parts: the
objective J and the replay u (``auto``/``aware``: from the defenses the victim publishes,
:mod:`fedleak.attacks.optimisation.adaptive`), the optimiser and the priors R_k, each
``NAME[:k=v;k=v]`` (priors joined by ``+``), ``T`` iterations per restart and ``R`` restarts. A
preset subclasses
:class:`ComposedConfig` with shorthand options (``lr=``, ``tv=``, …) that fill the parts it
leaves unset (:func:`fitting`). Every name and option is refused at configuration time, before
any observation is seen (ValueError naming the option).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from fedleak.attacks.optimisation.adaptive import AUTO, check_spec, parse_part
from fedleak.attacks.optimisation.batch_statistics import SOURCES
from fedleak.attacks.optimisation.engine.convolutions import CHOICES as CONVOLUTIONS
from fedleak.attacks.optimisation.optimisers import OPTIMISERS
from fedleak.attacks.optimisation.priors import PRIORS
from fedleak.attacks.parts import PartError

INITS = ("gaussian", "uniform")
SELECTS = ("total", "objective")
NO_PRIORS = "none"


@dataclass
class ComposedConfig:
    """The options every optimisation attack has; presets add shorthand options."""

    iterations: int = field(default=4800, metadata={"help": "optimiser steps per restart"})
    restarts: int = field(
        default=1, metadata={"help": "independent random inits; the lowest objective wins"}
    )
    objective: str = field(
        default=AUTO,
        metadata={"help": "objective part (cosine, masked-cosine, gaussian[:masked=on|off], "
                          "euclidean), aware: the one modelling the victim's published "
                          "defenses, or auto (with replay=auto): the aware and the blind "
                          "parts, half the iterations each, keeping the reconstruction that "
                          "better explains the update"},
    )
    replay: str = field(
        default=AUTO,
        metadata={"help": "replay part (plain, dp-clipped[:max-norm=C;clipping=flat]), aware: "
                          "the one modelling the published defenses, or auto (see objective)"},
    )
    optimizer: str = field(
        default="",
        metadata={"help": "optimiser part NAME[:k=v;k=v] (signed-adam, adam, sgd, lbfgs); "
                          "empty: the preset's, from its shorthand options"},
    )
    priors: str = field(
        default="",
        metadata={"help": "prior parts NAME[:k=v;k=v] joined by '+' (tv, bn, l2, "
                          "orthogonality, qian, group, box) or none; empty: the preset's, from "
                          "its shorthand options"},
    )
    init: str = field(default="gaussian", metadata={
        "help": "gaussian: N(0,1) in normalised space; uniform: U(0,1) in pixel space"})
    select: str = field(default="total", metadata={
        "help": "pick the restart by total (objective + priors) or objective alone"})
    log_every: int = field(
        default=50, metadata={"help": "report progress (and read the objective) every k steps"}
    )
    vectorised: bool = field(
        default=True,
        metadata={"help": "run the restarts as one batched computation (torch.func.vmap) when "
                          "the model allows it (no BatchNorm); same result per restart"},
    )
    capture: bool = field(
        default=True,
        metadata={"help": "on a GPU, record one iteration as a CUDA graph and replay it "
                          "(falls back to eager with a notice when capture fails)"},
    )
    compile: bool = field(
        default=False,
        metadata={"help": "compile the objective step with torch.compile (first-order "
                          "optimisers, a vectorisable replay; ~10-25 s CPU once, then cached "
                          "on disk); falls back to eager with a notice; same numbers up to "
                          "float rounding"},
    )
    convolutions: str = field(
        default="auto",
        metadata={"help": "CPU convolution kernels: native (ATen's), onednn, unfold (im2col "
                          "and a product, which a compiled step fuses), or auto (native for "
                          "one small image of a small model; unfold there when compiled)"},
    )

    workers: int = field(
        default=1,
        metadata={"help": "split the restarts across N forked processes, one thread each "
                          "(CPU, first-order optimisers); same result as 1, restart r seeded "
                          "seed + r wherever it runs"},
    )

    def __post_init__(self) -> None:
        """Refuse counts below 1, an unknown init or selection, and bad part specs."""
        check_numbers(self, at_least_one=("iterations", "restarts", "log_every", "workers"))
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.convolutions not in CONVOLUTIONS:
            raise ValueError(f"convolutions must be one of {', '.join(CONVOLUTIONS)}, got "
                             f"{self.convolutions!r}")
        if self.select not in SELECTS:
            raise ValueError(f"select must be one of {', '.join(SELECTS)}, got {self.select!r}")
        try:
            check_spec(self.objective, "objective")
            check_spec(self.replay, "replay")
            if self.optimizer:
                name, options = parse_part(self.optimizer)
                OPTIMISERS.create(name, options)
            for spec in prior_specs(self.priors):
                PRIORS.create(*parse_part(spec))
        except PartError as err:
            raise ValueError(str(err)) from None


def check_numbers(config: Any, positive: Sequence[str] = (),
                  non_negative: Sequence[str] = (), at_least_one: Sequence[str] = ()) -> None:
    """Refuse shorthand numbers out of range (ValueError naming the option)."""
    for name in positive:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be positive, got {value}")
    for name in non_negative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be >= 0, got {value}")
    for name in at_least_one:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")


def check_source(source: str) -> None:
    """Refuse an unknown BatchNorm statistics source."""
    if source not in SOURCES:
        raise ValueError(f"bn-source must be one of {', '.join(SOURCES)}, got {source!r}")


def prior_specs(priors: str) -> list[str]:
    """``tv:weight=0.01+box`` → [``tv:weight=0.01``, ``box``]; ``none`` → []."""
    if priors.strip() == NO_PRIORS:
        return []
    return [p.strip() for p in priors.split("+") if p.strip()]


def fitting(part: type[Any], options: dict[str, Any]) -> dict[str, Any]:
    """Return the shorthand ``options`` that part class ``part``'s Config has."""
    names = {f.name for f in fields(part.Config)}
    return {k: v for k, v in options.items() if k in names}
