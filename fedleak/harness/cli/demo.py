"""``fedleak demo``: a victim process on a free loopback port, attacked, scored, stopped."""

from __future__ import annotations

import secrets
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fedleak.harness.cli.options import check_device


@click.command()
@click.option("--dataset", default="photos", show_default=True)
@click.option("--model", default="lenet-zhu", show_default=True)
@click.option("--attack", "attack_name", default="inverting-gradients", show_default=True)
@click.option("--images", default="2", show_default=True,
              help="Which private images the victim holds; one round each.")
@click.option("--iterations", default=4800, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/demo-TIMESTAMP).")
def demo(**kw: Any) -> None:
    """Start a victim on a free loopback port, attack it, print the scores, stop it.

    The victim runs as its own process; the attacker (this process) only talks to it over gRPC.
    """
    from fedleak.harness.attacker.client import VictimClient, VictimError
    from fedleak.harness.attacker.run import run_attack
    from fedleak.harness.attacker.settings import AttackSettings
    from fedleak.harness.shared.selection import SelectionError, parse_indices
    from fedleak.harness.victim.process import VictimProcess
    from fedleak.harness.victim.settings import VictimSettings

    check_device(kw["device"])
    try:
        rounds = len(parse_indices(kw["images"], 10**9))
    except SelectionError as err:
        raise click.BadParameter(str(err), param_hint="--images") from None
    out = Path(kw["out"]) if kw["out"] else Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    token = secrets.token_hex(16)
    victim = VictimSettings(dataset=kw["dataset"], split="all", images=kw["images"],
                            model=kw["model"], seed=kw["seed"], reveal=True)
    started = time.perf_counter()
    with VictimProcess(victim, token=token) as proc:
        click.echo(f"victim started at {proc.address} (pid {proc.pid})")
        settings = AttackSettings(attack=kw["attack_name"],
                                  options={"iterations": kw["iterations"]},
                                  device=kw["device"], seed=kw["seed"], rounds=rounds)
        with VictimClient(proc.address, token=token) as client:
            try:
                record = run_attack(client, settings, out, log=click.echo)
            except VictimError as err:
                raise click.ClickException(str(err)) from None
    for line in record.summary_lines(out):
        click.echo(line)
    click.echo(f"demo finished in {time.perf_counter() - started:.0f} s")
