"""How a command that talks to a victim ends when something goes wrong, written once.

A victim's refusal (:class:`~fedleak.harness.attacker.client.VictimError`) becomes a click
error naming the victim; bad input found on this side (``ValueError``) one naming what to
change; Ctrl-C exits with 130 after saying where what finished was kept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click


@contextmanager
def attacker_errors(address: str, kept: str) -> Iterator[None]:
    """Run a command's talk with the victim at ``address``; ``kept`` says where what finished
    is (printed on Ctrl-C)."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: {kept}", err=True)
        sys.exit(130)
    except Exception as err:
        # imported here: the CLI starts without loading the attacker (grpc, torch)
        from fedleak.harness.attacker.client import VictimError

        if isinstance(err, VictimError):
            raise click.ClickException(f"victim at {address}: {err}") from None
        if isinstance(err, ValueError):
            raise click.ClickException(str(err)) from None
        raise
