"""What the victim bounds: "What a server may ask" (local training) and "State kept" (memory)
of ``fedleak victim serve --help``."""

from __future__ import annotations

from dataclasses import dataclass

import click

from fedleak.harness.cli.options import F, packed


@dataclass(frozen=True)
class RequestLimitOptions:
    """The most local training a server may ask for in one round."""

    max_local_epochs: int
    max_local_steps: int
    max_lr: float


def request_limit_options(function: F) -> F:
    """The request limits, handed to the command as ``requests``."""
    return packed(RequestLimitOptions, "requests", [
        click.option("--max-local-epochs", default=100, show_default=True,
                     type=click.IntRange(1),
                     help="The most FedAvg local epochs E a server may ask for."),
        click.option("--max-local-steps", default=10_000, show_default=True,
                     type=click.IntRange(1),
                     help="The most FedAvg local steps E·⌈n/B⌉ a server may ask for."),
        click.option("--max-lr", default=10.0, show_default=True,
                     type=click.FloatRange(0, min_open=True),
                     help="The largest learning rate a server may ask for (FedAvg τ, release)."),
    ])(function)


@dataclass(frozen=True)
class MemoryOptions:
    """What the victim keeps between calls, each bounded in MiB."""

    secagg_memory_mb: int
    feature_memory_mb: int
    release_memory_mb: int


def memory_options(function: F) -> F:
    """The memory bounds, handed to the command as ``memory``."""
    return packed(MemoryOptions, "memory", [
        click.option("--secagg-memory-mb", default=1024, show_default=True,
                     type=click.IntRange(1),
                     help="Bytes (MiB) of secure-aggregation state kept: users' updates of "
                          "unfinished rounds. The oldest rounds are forgotten to make room; a "
                          "round larger than this is refused (RESOURCE_EXHAUSTED)."),
        click.option("--feature-memory-mb", default=512, show_default=True,
                     type=click.IntRange(1),
                     help="Bytes (MiB) of round parameters kept for scoring recovered features "
                          "(the latest round always)."),
        click.option("--release-memory-mb", default=512, show_default=True,
                     type=click.IntRange(1),
                     help="Bytes (MiB) of released models kept for Score and Reveal (the oldest "
                          "forgotten); a model larger than this is not released."),
    ])(function)
