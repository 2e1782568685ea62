"""``fedleak attack``: the honest-but-curious server against a running victim.

    fedleak attack --victim 127.0.0.1:50051 --attack inverting-gradients --out runs/x

The options become one :class:`~fedleak.harness.attacker.attack_settings.AttackSettings` here; the
run (either threat model) and its summary are the attacker room's.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fedleak.harness.cli.options import (
    LazyEpilog,
    check_device,
    option_pairs,
    protocol_options,
    protocol_values,
    read_tokens,
    token_options,
)


def _attack_epilog() -> str:
    from fedleak.attacks import attack_class, attack_names, describe_options
    from fedleak.attacks.composed import ComposedInversion
    from fedleak.attacks.objectives import OBJECTIVES
    from fedleak.attacks.optimisers import OPTIMISERS
    from fedleak.attacks.priors import PRIORS
    from fedleak.attacks.replays import REPLAYS

    lines = ["\b", "Attacks [threat model] and their options (-o key=value):"]
    for name in attack_names():
        lines.append(f"  {name} [{getattr(attack_class(name), 'server_role', 'honest')} server]")
        lines += [f"    {line}" for line in describe_options(name).splitlines()]
    presets = [n for n in attack_names() if issubclass(attack_class(n), ComposedInversion)]
    lines += ["", "\b", f"Parts of the optimisation attacks (presets: {', '.join(presets)}): "
              "-o objective=NAME[:k=v;k=v] and -o replay=NAME[:k=v] (or aware: chosen from "
              "the victim's published defenses; the default, auto, runs the aware and the blind "
              "parts at half the iterations each and keeps what explains the update better), "
              "-o optimizer=NAME[:k=v;k=v], "
              "-o priors=NAME[:k=v;k=v]+NAME... (or none):"]
    for kind, registry in (("objective", OBJECTIVES), ("replay", REPLAYS),
                           ("optimizer", OPTIMISERS), ("prior", PRIORS)):
        for name in registry.names():
            lines.append(f"  {kind} {name}")
            lines += [f"    {line}" for line in registry.describe(name).splitlines()]
    return "\n".join(lines)


def default_out(attack: str) -> Path:
    """``runs/ATTACK-TIMESTAMP``."""
    return Path("runs") / f"{attack}-{datetime.now():%Y%m%d-%H%M%S}"


@click.command(cls=LazyEpilog, epilog_factory=_attack_epilog)
@click.option("--victim", "address", default=None, help="Victim address HOST:PORT.")
@click.option("--from-recording", type=click.Path(file_okay=False, exists=True), default=None,
              help="Attack the rounds a Flower audit recorded (LeakageAudit record_only, "
                   "`fedleak flower simulate --record-only`) instead of a victim; unscored.")
@click.option("--attack", default="inverting-gradients", show_default=True,
              help="Attack name (listed below).")
@click.option("--option", "-o", multiple=True, help="Attack option key=value (repeatable).")
@click.option("--iterations", type=click.IntRange(1), default=None,
              help="Optimisation steps per restart (attack default if unset).")
@click.option("--restarts", type=click.IntRange(1), default=None,
              help="Random restarts; the lowest objective wins (attack default if unset).")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1),
              help="Rounds to attack, each on the victim's next private batch.")
@click.option("--pack", default=1, show_default=True, type=click.IntRange(1),
              help="Attack this many rounds as one packed computation (inverting-gradients, "
                   "fedavg): the same result per round, one GPU kept busy. Other attacks run "
                   "them one after the other.")
@click.option("--seed", default=0, show_default=True, help="Seeds the attack's initialisation.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Send these trained parameters instead of the victim's global model.")
@click.option("--model-seed", type=int, default=None,
              help="Send a fresh model initialised with this seed instead.")
@click.option("--flip-labels", default=None, metavar="A,B",
              help="Dishonest server: swap classifier rows A and B of θ before sending "
                   "(label flipping, Inverting Gradients supplement A.2).")
@click.option("--secagg-target", default="sum", show_default=True,
              help="Against a secure-aggregation victim: attack the unmasked 'sum' of the "
                   "survivors' updates, or one masked vector 'user:U'.")
@protocol_options(victim=False)
@click.option("--release-lr", type=click.FloatRange(0, min_open=True), default=None,
              help="Release attacks (kkt): ask the victim to train at this step size.")
@click.option("--release-epochs", type=click.IntRange(1), default=None,
              help="Release attacks: ask for this epoch budget (at most the victim's).")
@click.option("--release-target-loss", type=click.FloatRange(0, min_open=True), default=None,
              help="Release attacks: ask the victim to stop at this training loss.")
@click.option("--recovered-ssim", type=click.FloatRange(-1, 1), default=None,
              help="Release attacks: SSIM at which a training sample counts as recovered "
                   "(victim default 0.4).")
@token_options
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM root certificate to verify a TLS victim.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/ATTACK-TIMESTAMP).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def attack(**kw: Any) -> None:
    """Attack a victim as the server and write the run to --out.

    Honest attacks send the real global model and invert what comes back. Malicious ones
    (imprint, trap-weights, fishing) craft the parameters θ they send, for one or several
    probe rounds, and are refused at once when the victim's model cannot carry them; their
    runs count exact recoveries (PSNR >= 40 dB) and record the threat model.
    """
    from fedleak.attacks import AttackConfigError, create_attack
    from fedleak.harness.attacker.client import VictimClient, VictimError
    from fedleak.harness.attacker.run import run_attack

    check_device(kw["device"])
    settings = attack_settings(kw)
    try:
        create_attack(settings.attack, settings.options)
    except AttackConfigError as err:
        raise click.UsageError(str(err)) from None
    out = Path(kw["out"]) if kw["out"] else default_out(settings.attack)
    if (kw["address"] is None) == (kw["from_recording"] is None):
        raise click.UsageError("give either --victim HOST:PORT or --from-recording DIR")
    if kw["from_recording"]:
        attack_recorded(Path(kw["from_recording"]), settings, out)
        return
    ca = Path(kw["tls_ca"]).read_bytes() if kw["tls_ca"] else None
    token, score_token = read_tokens(kw)
    try:
        client = VictimClient(kw["address"], token=token, tls_ca=ca, score_token=score_token)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--victim") from None
    with client:
        try:
            client.wait_ready(timeout=15)
            record = run_attack(client, settings, out, log=click.echo)
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted: what finished is in {out / 'metrics.json'}", err=True)
            sys.exit(130)
        except VictimError as err:
            raise click.ClickException(f"victim at {kw['address']}: {err}") from None
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    for line in record.summary_lines(out):
        click.echo(line)


def attack_recorded(recording: Path, settings: Any, out: Path) -> None:
    """``--from-recording``: attack every recorded round, write the (unscored) run."""
    from fedleak.harness.attacker.recording import RecordingError, attack_recording

    try:
        record = attack_recording(recording, settings.attack, settings.options, out,
                                  seed=settings.seed, device=settings.device,
                                  show_progress=settings.show_progress, log=click.echo)
    except RecordingError as err:
        raise click.BadParameter(str(err), param_hint="--from-recording") from None
    for line in record.summary_lines(out):
        click.echo(line)


def attack_settings(kw: dict[str, Any]) -> Any:
    """The attack the command-line options describe."""
    from fedleak.harness.attacker.attack_settings import AttackSettings, ReleaseRequest
    from fedleak.harness.federated.protocol import ProtocolError, changes_from_options

    options: dict[str, Any] = option_pairs(kw["option"], "--option")
    for key in ("iterations", "restarts"):
        if kw.get(key) is not None:
            options[key] = kw[key]
    flip = None
    if kw.get("flip_labels"):
        try:
            a, b = (int(v) for v in kw["flip_labels"].split(","))
        except ValueError:
            raise click.BadParameter("give two class indices, e.g. 3,5",
                                     param_hint="--flip-labels") from None
        flip = (a, b)
    release = ReleaseRequest(learning_rate=kw.get("release_lr") or 0.0,
                             max_epochs=kw.get("release_epochs") or 0,
                             target_loss=kw.get("release_target_loss") or 0.0)
    try:
        return AttackSettings(
            attack=kw["attack"], options=options, device=kw["device"], seed=kw["seed"],
            rounds=kw["rounds"], pack=kw["pack"], checkpoint=kw["checkpoint"],
            model_seed=kw["model_seed"],
            protocol=changes_from_options(protocol_values(kw)), flip_labels=flip,
            secagg_target=kw.get("secagg_target") or "sum",
            show_progress=not kw.get("quiet", False), release=release,
            recovered_ssim=kw.get("recovered_ssim") or 0.0,
        )
    except ProtocolError as err:
        raise click.UsageError(str(err)) from None
    except ValueError as err:  # the secure-aggregation target
        raise click.BadParameter(str(err), param_hint="--secagg-target") from None
