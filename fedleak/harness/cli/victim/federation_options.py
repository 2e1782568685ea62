"""What leaves the user and how: "Federated users" (how many, buffers, secure-aggregation
dropouts) and "Defenses" (the chain) of ``fedleak victim serve --help``."""

from __future__ import annotations

from dataclasses import dataclass

import click

from fedleak.harness.cli.options import F, packed


@dataclass(frozen=True)
class FederatedUserOptions:
    """The users behind this victim and what their updates carry."""

    users: int
    return_buffers: str
    secagg_drop: tuple[str, ...]


def federation_options(function: F) -> F:
    """The federation options, handed to the command as ``federation``."""
    return packed(FederatedUserOptions, "federation", [
        click.option("--users", default=1, show_default=True, type=click.IntRange(1),
                     help="Federated users behind this victim, each with its own shard of the "
                          "pool (more than one needs --defense secagg)."),
        click.option("--return-buffers", type=click.Choice(["never", "fedavg", "always"]),
                     default="fedavg", show_default=True,
                     help="When updates carry the BatchNorm running statistics local training "
                          "left (as a FedAvg client's state_dict does); published in Describe."),
        click.option("--secagg-drop", multiple=True, metavar="USER@PHASE",
                     help="Simulate a user going offline in secure aggregation from PHASE on "
                          "(advertise-keys, share-keys, masked-input, unmasking); repeatable."),
    ])(function)


@dataclass(frozen=True)
class DefenseOptions:
    """The defense chain, applied in order before anything leaves the user."""

    defense_specs: tuple[str, ...]
    defense_file: str | None
    defense_seed: int | None


def defense_options(function: F) -> F:
    """The defense options, handed to the command as ``defenses``."""
    return packed(DefenseOptions, "defenses", [
        click.option("--defense", "defense_specs", multiple=True, metavar="NAME:KEY=VALUE,...",
                     help="A defense of the chain, e.g. dpsgd:noise-multiplier=0.5 or "
                          "prune:p=0.9 (repeatable, applied in order); `fedleak list` shows "
                          "every defense with its parameters."),
        click.option("--defense-file", type=click.Path(dir_okay=False, exists=True),
                     default=None,
                     help="TOML file with [[defense]] tables (name = ..., then parameters)."),
        click.option("--defense-seed", type=int, default=None,
                     help="Fix the defenses' randomness (reproducible experiments; default: "
                          "secret)."),
    ])(function)
