"""``fedleak attack``: the honest-but-curious server against a running victim.

    fedleak attack --victim 127.0.0.1:50051 --attack inverting-gradients --out runs/x

The options become one :class:`~fedleak.harness.attacker.attack_settings.AttackSettings` here; the
run (either threat model) and its summary are the attacker room's.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fedleak.harness.cli.attacker_errors import attacker_errors
from fedleak.harness.cli.options import (
    LazyEpilog,
    ProtocolOptions,
    TokenOptions,
    check_device,
    option_pairs,
    protocol_options,
    token_options,
)


def _attack_epilog() -> str:
    from fedleak.attacks import attack_class, attack_names, describe_options
    from fedleak.attacks.optimisation.composed import ComposedInversion
    from fedleak.attacks.optimisation.objectives import OBJECTIVES
    from fedleak.attacks.optimisation.optimisers import OPTIMISERS
    from fedleak.attacks.optimisation.priors import PRIORS
    from fedleak.attacks.optimisation.replays import REPLAYS

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
@click.option("--model-factory", default=None, expose_value=False, metavar="MODULE:FACTORY",
              callback=lambda ctx, param, value: _trust_factory(value),
              help="The victim serves your own model module:factory (its Describe says so): "
                   "import it here too (its folder on PYTHONPATH). Only a factory named here is "
                   "ever imported.")
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
def attack(address: str | None, from_recording: str | None, attack: str,
           option: tuple[str, ...], iterations: int | None, restarts: int | None, rounds: int,
           pack: int, seed: int, device: str, checkpoint: str | None, model_seed: int | None,
           flip_labels: str | None, secagg_target: str, protocol: ProtocolOptions,
           release_lr: float | None, release_epochs: int | None,
           release_target_loss: float | None, recovered_ssim: float | None,
           tokens: TokenOptions, tls_ca: str | None, out: str | None, quiet: bool) -> None:
    """Attack a victim as the server and write the run to --out.

    Honest attacks send the real global model and invert what comes back. Malicious ones
    (imprint, trap-weights, fishing) craft the parameters θ they send, for one or several
    probe rounds, and are refused at once when the victim's model cannot carry them; their
    runs count exact recoveries (PSNR >= 40 dB) and record the threat model.
    """
    from fedleak.attacks import AttackConfigError, create_attack
    from fedleak.harness.attacker.client import VictimClient
    from fedleak.harness.attacker.run import run_attack

    check_device(device)
    settings = attack_settings(
        attack=attack, option=option, iterations=iterations, restarts=restarts, rounds=rounds,
        pack=pack, seed=seed, device=device, checkpoint=checkpoint, model_seed=model_seed,
        flip_labels=flip_labels, secagg_target=secagg_target, protocol=protocol,
        release=release_request(release_lr, release_epochs, release_target_loss),
        recovered_ssim=recovered_ssim, quiet=quiet)
    try:
        create_attack(settings.attack, settings.options)
    except AttackConfigError as err:
        raise click.UsageError(str(err)) from None
    run_dir = Path(out) if out else default_out(settings.attack)
    if (address is None) == (from_recording is None):
        raise click.UsageError("give either --victim HOST:PORT or --from-recording DIR")
    if from_recording:
        attack_recorded(Path(from_recording), settings, run_dir)
        return
    assert address is not None  # exactly one of --victim and --from-recording
    ca = Path(tls_ca).read_bytes() if tls_ca else None
    token, score_token = tokens.read()
    try:
        client = VictimClient(address, token=token, tls_ca=ca, score_token=score_token)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--victim") from None
    with client:
        with attacker_errors(address, f"what finished is in {run_dir / 'metrics.json'}"):
            client.wait_ready(timeout=15)
            record = run_attack(client, settings, run_dir, log=click.echo)
    for line in record.summary_lines(run_dir):
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


def release_request(lr: float | None, epochs: int | None, target_loss: float | None) -> Any:
    """What a release attack asks the victim to train with (0: the victim's own setting)."""
    from fedleak.harness.attacker.attack_settings import ReleaseRequest

    return ReleaseRequest(learning_rate=lr or 0.0, max_epochs=epochs or 0,
                          target_loss=target_loss or 0.0)


def attack_settings(*, attack: str, option: tuple[str, ...], iterations: int | None,
                    restarts: int | None, rounds: int, pack: int, seed: int, device: str,
                    checkpoint: str | None, model_seed: int | None, flip_labels: str | None,
                    secagg_target: str | None, protocol: ProtocolOptions, release: Any,
                    recovered_ssim: float | None, quiet: bool) -> Any:
    """The attack the command-line options describe."""
    from fedleak.harness.attacker.attack_settings import AttackSettings
    from fedleak.harness.federated.protocol import ProtocolError, changes_from_options

    options: dict[str, Any] = option_pairs(option, "--option")
    for key, value in (("iterations", iterations), ("restarts", restarts)):
        if value is not None:
            options[key] = value
    flip = None
    if flip_labels:
        try:
            a, b = (int(v) for v in flip_labels.split(","))
        except ValueError:
            raise click.BadParameter("give two class indices, e.g. 3,5",
                                     param_hint="--flip-labels") from None
        flip = (a, b)
    try:
        return AttackSettings(
            attack=attack, options=options, device=device, seed=seed,
            rounds=rounds, pack=pack, checkpoint=checkpoint,
            model_seed=model_seed,
            protocol=changes_from_options(protocol.values()), flip_labels=flip,
            secagg_target=secagg_target or "sum",
            show_progress=not quiet, release=release,
            recovered_ssim=recovered_ssim or 0.0,
        )
    except ProtocolError as err:
        raise click.UsageError(str(err)) from None
    except ValueError as err:  # the secure-aggregation target
        raise click.BadParameter(str(err), param_hint="--secagg-target") from None


def _trust_factory(value: str | None) -> None:
    """``--model-factory``: let this process import the user's own model factory."""
    if value:
        from fedleak.harness.zoo.user_models import trust

        try:
            trust(value)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--model-factory") from None
