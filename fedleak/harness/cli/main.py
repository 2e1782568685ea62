"""The ``fedleak`` command: victim and attacker as separate processes, and the demo that runs both.

    fedleak victim serve --dataset photos --model lenet-zhu --port 0 --allow-reveal
    fedleak attack --victim 127.0.0.1:PORT --attack inverting-gradients --out runs/x
    fedleak demo
    fedleak audit --victim 127.0.0.1:PORT          # ε lower bounds beside the claimed ε

Each command group lives in its own module of this room; this one assembles them.
"""

from __future__ import annotations

import os
import sys

import click

from fedleak.harness.cli.attack_command import attack
from fedleak.harness.cli.audit_command import audit
from fedleak.harness.cli.defense_command import defense
from fedleak.harness.cli.demo_command import demo
from fedleak.harness.cli.flower_command import flower
from fedleak.harness.cli.informed_command import informed_adversary
from fedleak.harness.cli.sweep_command import report, sweep
from fedleak.harness.cli.train_command import train_model
from fedleak.harness.cli.victim.command import victim


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="fedleak")
def main() -> None:
    """Measure how much private data leaks out of federated learning.

    A victim process plays the federated user; an attacker process plays the
    honest-but-curious server and reconstructs the user's images from what it receives.
    """


@main.command("list")
def list_names() -> None:
    """List data sets, models with their options, attacks and defenses with their parameters."""
    from fedleak.attacks import attack_class, attack_names
    from fedleak.harness.zoo.datasets import DATASET_NAMES
    from fedleak.harness.zoo.models import model_names, model_options
    from fedleak.harness.zoo.text.corpus import TEXT_CORPORA
    from fedleak.harness.zoo.text.text_models import TEXT_MODELS, text_model_options

    click.echo("data sets: " + ", ".join(DATASET_NAMES) + "; text: " + ", ".join(TEXT_CORPORA))
    click.echo("models (--model NAME[:key=value,...]):")
    for name in model_names():
        options = model_options(name)
        click.echo(f"  {name}" + (f"  options: {', '.join(options)}" if options else ""))
    for name in TEXT_MODELS:
        click.echo(f"  {name} (text)  options: {', '.join(text_model_options(name))}")
    click.echo("attacks [threat model] (options: `fedleak attack --help`):")
    for name in attack_names():
        cls = attack_class(name)
        role = getattr(cls, "server_role", "honest")
        what = {"release": "released model", "text-update": "text updates"}.get(
            cls.threat_model, "updates")
        click.echo(f"  {name} [{role} server, {what}]")
    click.echo("defenses (--defense NAME:key=value,...):")
    from fedleak.defenses import DEFENSES, defense_names

    for name in defense_names():
        click.echo(f"  {name} [{DEFENSES.get(name).stage}]")
        for line in DEFENSES.describe(name).splitlines():
            click.echo(f"    {line}")


for command in (victim, attack, audit, demo, train_model, sweep, report, defense, flower,
                informed_adversary):
    main.add_command(command)


if __name__ == "__main__":
    main(prog_name=os.path.basename(sys.argv[0]))
