"""``fedleak demo``: a victim process on a free loopback port, attacked, scored, stopped."""

from __future__ import annotations

import secrets
import time
from datetime import datetime
from pathlib import Path

import click

from fedleak.harness.cli.options import check_device


@click.command()
@click.option("--dataset", default="photos", show_default=True,
              help="The victim's private data: digits, faces or photos (bundled), or "
                   "cifar10/cifar100/imagefolder with `fedleak victim serve --data-root`.")
@click.option("--model", default="lenet-zhu", show_default=True,
              help="Model name[:key=value,...] the victim trains (`fedleak list`).")
@click.option("--attack", "attack_name", default="inverting-gradients", show_default=True,
              help="The attack (`fedleak attack --help` lists them with their options).")
@click.option("--images", default="2", show_default=True,
              help="Which private images of the data set (split all) the victim holds, e.g. "
                   "0-3,7; one round each.")
@click.option("--iterations", default=4800, show_default=True, type=click.IntRange(1),
              help="Optimisation steps of the attack per round (Geiping et al.: 4800).")
@click.option("--seed", default=0, show_default=True,
              help="Seeds the victim's model and the attack's initialisation.")
@click.option("--device", default="cpu", show_default=True,
              help="Where the attack runs: cpu or cuda.")
@click.option("--compile/--no-compile", "compiled", default=False, show_default=True,
              help="Compile the attack's objective step (`-o compile=on` of `fedleak attack`): "
                   "the first run on a machine compiles (about 20 s more), later runs load "
                   "the saved step and take about half the eager time.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder for metrics.json and the pictures (default runs/demo-TIMESTAMP).")
def demo(dataset: str, model: str, attack_name: str, images: str, iterations: int, seed: int,
         device: str, compiled: bool, out: str | None) -> None:
    """Start a victim on a free loopback port, attack it, print the scores, stop it.

    The victim runs as its own process; the attacker (this process) only talks to it over gRPC.
    The victim scores the reconstruction against the private image it holds: higher PSNR
    (dB) and SSIM mean more of the image leaked (above about 20 dB it is recognisable).
    """
    from fedleak.harness.attacker.attack_settings import AttackSettings
    from fedleak.harness.attacker.client import VictimClient, VictimError
    from fedleak.harness.attacker.run import run_attack
    from fedleak.harness.victim.process import VictimProcess
    from fedleak.harness.victim.selection import SelectionError, parse_indices
    from fedleak.harness.victim.settings import VictimSettings

    check_device(device)
    try:
        rounds = len(parse_indices(images, 10**9))
    except SelectionError as err:
        raise click.BadParameter(str(err), param_hint="--images") from None
    from fedleak.attacks.attack_registry import AttackConfigError, create_attack

    options: dict[str, object] = {"iterations": iterations}
    if compiled:
        options["compile"] = True
    try:  # a wrong name or an option the attack lacks: said before any process starts
        create_attack(attack_name, options)
    except (AttackConfigError, KeyError, ValueError) as err:
        raise click.BadParameter(f"{err} (the demo passes --iterations and --compile to the "
                                 "attack; for other attacks use `fedleak attack`)",
                                 param_hint="--attack") from None
    run_dir = Path(out) if out else Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    token = secrets.token_hex(16)
    victim = VictimSettings(dataset=dataset, split="all", images=images,
                            model=model, seed=seed, reveal=True)
    started = time.perf_counter()
    with VictimProcess(victim, token=token) as proc:
        click.echo(f"victim started at {proc.address} (pid {proc.pid})")
        settings = AttackSettings(attack=attack_name, options=options,
                                  device=device, seed=seed, rounds=rounds)
        with VictimClient(proc.address, token=token) as client:
            try:
                record = run_attack(client, settings, run_dir, log=click.echo)
            except VictimError as err:
                raise click.ClickException(str(err)) from None
    for line in record.summary_lines(run_dir):
        click.echo(line)
    click.echo(f"demo finished in {time.perf_counter() - started:.0f} s")
