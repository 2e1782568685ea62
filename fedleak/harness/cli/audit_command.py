"""``fedleak audit``: a measured ε lower bound for a victim's defenses, beside the accountant's ε.

    fedleak audit --victim 127.0.0.1:50051 --out runs/audit
    fedleak audit --defense dpsgd:noise-multiplier=1 --detect-shortfall 0.9

Registered on the ``fedleak`` group by :mod:`fedleak.harness.cli.main`.
"""

from __future__ import annotations

import secrets
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fedleak.auditing.audit_defaults import (
    DEFAULT_CALIBRATION,
    DEFAULT_CONFIDENCE,
    DEFAULT_FALSE_ALARM,
    DEFAULT_POWER,
    DEFAULT_SHORTFALL,
    DEFAULT_THRESHOLD_RULE,
)
from fedleak.harness.cli.options import (
    ProtocolOptions,
    TokenOptions,
    protocol_options,
    token_options,
)

HELP = """Audit a victim's privacy: play the distinguishing game and print ε lower bounds.

\b
Per trial the victim flips a secret fair coin and runs its user's update with a
synthetic, public canary (coin "in") or without it; the canary enters BEFORE the
defense chain, so clipping, DP-SGD, noise, pruning, secure aggregation and remote
defenses act on it as on real data. This process (the server) scores every trial
from what it received, submits the scores once, and the victim — which alone
holds the coins — answers with ε lower bounds (Clopper–Pearson, Gaussian-DP route,
one-run bound, and per parameter group the noise-ratio tests of the declared
mechanism over many canaries), the ε the chain declares for one trial, whether a
test rejects the declaration (a VIOLATION, at --false-alarm over all tests), what a
verdict without one could have caught (the noise shortfall, at --power), and
Andrew et al.'s one-shot estimate apart, with its interval (an estimate only).

\b
What ε_LB means: with the stated confidence, no mechanism that really were
(ε, δ)-DP for this canary could have been told apart this well, for any ε below
ε_LB. It is a lower bound for THIS canary and threat model; a gap to the claimed ε
is a weak canary or a loose accountant, never "more private". ε_LB above the claim
is a VIOLATION: the mechanism is not what it says (docs/audit.md).

\b
Against a running victim (started with --allow-audit) give --victim; otherwise
this command starts one (as `fedleak demo` does) from the victim options below.
Writes OUT/audit.json and OUT/audit.png (score histograms, threshold, ε_LB beside
the claimed ε).
"""


@click.command("audit", help=HELP)
@click.option("--victim", "address", default=None,
              help="A running victim HOST:PORT (started with --allow-audit). Without it, a "
                   "victim is started from the options below.")
@click.option("--canary", type=click.Choice(["gradient", "input", "client"]),
              default="gradient", show_default=True,
              help="gradient: a direction entering as one extra example's gradient (or added "
                   "to the update); input: a mislabelled noise image added to the batch; "
                   "client: a canary user's update among secure-aggregation users.")
@click.option("--direction", type=click.Choice(["dirac", "random"]), default=None,
              help="Gradient/client canaries: a Dirac on a quiet coordinate or a seeded random "
                   "direction (default dirac for gradient, random for client).")
@click.option("--canary-seed", default=0, show_default=True, type=click.IntRange(0),
              help="Seeds the canary (public).")
@click.option("--canary-norm", default=0.0, show_default=True, type=click.FloatRange(0),
              help="‖c‖ (0: the chain's clip norm, else 1; DP-SGD: 10·C, clipped to C).")
@click.option("--coordinate", default=None, type=click.IntRange(0),
              help="Dirac canaries: the flat parameter index (default: the victim picks the "
                   "coordinate a public synthetic batch moves least).")
@click.option("--trials", default=None, type=click.IntRange(4),
              help="Trials (coins); about half carry each canary. Default: as many as "
                   "--detect-shortfall needs (at most --max-trials), or 2000 when the chain "
                   "claims nothing.")
@click.option("--detect-shortfall", default=DEFAULT_SHORTFALL, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Without --trials: choose the trials that catch noise this factor of the "
                   "declared std (0.9: 10 %% short) with --power probability.")
@click.option("--power", default=DEFAULT_POWER, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="The probability --detect-shortfall asks for, and that every verdict "
                   "states its detectable shortfall at.")
@click.option("--max-trials", default=None, type=click.IntRange(4),
              help="At most this many trials when they are chosen by power (default 4,000; "
                   "1,000 secure-aggregation rounds; never more than the victim's "
                   "--max-audit-trials).")
@click.option("--false-alarm", default=DEFAULT_FALSE_ALARM, show_default=True,
              type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
              help="The verdict's family-wise false-alarm rate: a correct mechanism is "
                   "called a violation with at most this probability (Holm over every test).")
@click.option("--coverage/--single-canary", default=True, show_default=True,
              help="Canaries over every parameter tensor and the declared clip geometry, "
                   "each tested (default), or the primary canary alone.")
@click.option("--delta", default=0.0, show_default=True, type=click.FloatRange(0, 1,
                                                                             max_open=True),
              help="δ of the bounds (0: the chain's δ, else 1e-5).")
@click.option("--confidence", default=DEFAULT_CONFIDENCE, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Confidence of every bound.")
@click.option("--threshold", "threshold", default=DEFAULT_THRESHOLD_RULE, show_default=True,
              help="How the decision threshold is chosen without the scored trials: "
                   "half-shift (fixed before the trials at half the canary's expected score "
                   "shift, from public settings; split where they do not fix it), split (a "
                   "random --calibration share chooses it), or a number (declared before "
                   "the trials).")
@click.option("--calibration", default=DEFAULT_CALIBRATION, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="split: the share of trials that chooses the threshold.")
@click.option("--batch", default=256, show_default=True, type=click.IntRange(1),
              help="Trials fetched per call.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/audit-TIMESTAMP).")
@click.option("--fail-on-violation", is_flag=True,
              help="Exit with status 3 when a bound exceeds the claimed ε.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@token_options
@click.option("--dataset", default="digits", show_default=True,
              help="Started victim: its private data.")
@click.option("--model", default="mlp:width=16,depth=1", show_default=True,
              help="Started victim: its model.")
@click.option("--images", default="0-63", show_default=True,
              help="Started victim: private pool (indices of split all).")
@click.option("--batch-size", "-n", default=8, show_default=True, type=click.IntRange(1),
              help="Started victim: private images per round.")
@click.option("--users", default=1, show_default=True, type=click.IntRange(1),
              help="Started victim: users (more than one needs --defense secagg).")
@click.option("--defense", "defenses", multiple=True, metavar="NAME:KEY=VALUE,...",
              help="Started victim: a defense of its chain (repeatable, in order).")
@click.option("--defense-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Started victim: TOML file of [[defense]] tables.")
@click.option("--defense-seed", type=int, default=None,
              help="Started victim: fix the defenses' randomness (and the coins).")
@click.option("--seed", default=0, show_default=True, help="Started victim: model seed.")
@protocol_options(victim=True)
def audit(address: str | None, canary: str, direction: str | None, canary_seed: int,
          canary_norm: float, coordinate: int | None, trials: int | None,
          detect_shortfall: float, power: float, max_trials: int | None,
          false_alarm: float,
          coverage: bool, delta: float,
          confidence: float, threshold: str, calibration: float, batch: int, out: str | None,
          fail_on_violation: bool, quiet: bool, tokens: TokenOptions, dataset: str, model: str,
          images: str, batch_size: int, users: int, defenses: tuple[str, ...],
          defense_file: str | None, defense_seed: int | None, seed: int,
          protocol: ProtocolOptions) -> None:
    from fedleak.harness.attacker.client import VictimClient, VictimError
    from fedleak.harness.attacker.games.audit_trials import AuditSettings, run_audit

    rule, value = _threshold(threshold)
    settings = AuditSettings(
        canary=canary, direction=direction or "", seed=canary_seed,
        norm=canary_norm, coordinate=coordinate, trials=trials or 0,
        delta=delta, confidence=confidence, threshold_rule=rule, threshold=value,
        calibration_fraction=calibration, detect_shortfall=detect_shortfall, power=power,
        false_alarm=false_alarm, coverage=coverage, max_chosen_trials=max_trials or 0,
        batch=batch, show_progress=not quiet)
    run_dir = Path(out) if out else \
        Path("runs") / f"audit-{datetime.now():%Y%m%d-%H%M%S}"
    token, score_token = tokens.read()
    try:
        if address:
            with VictimClient(address, token=token, score_token=score_token) as client:
                client.wait_ready(timeout=15)
                record = run_audit(client, settings, run_dir, log=click.echo)
        else:
            victim = _started_victim(
                dataset=dataset, model=model, images=images, batch_size=batch_size,
                users=users, defenses=defenses, defense_file=defense_file,
                defense_seed=defense_seed, seed=seed, protocol=protocol)
            record = _against_started_victim(victim, settings, run_dir)
    except VictimError as err:
        raise click.ClickException(str(err)) from None
    for line in record.summary_lines():
        click.echo(line)
    click.echo(f"wrote {run_dir / 'audit.json'} and {run_dir / 'audit.png'}")
    sys.stdout.flush()
    if record.violation and fail_on_violation:
        sys.exit(3)


def _threshold(text: str) -> tuple[str, float]:
    if text in ("split", "half-shift"):
        return text, 0.0
    try:
        return "declared", float(text)
    except ValueError:
        raise click.BadParameter("use split, half-shift or a number",
                                 param_hint="--threshold") from None


def _started_victim(*, dataset: str, model: str, images: str, batch_size: int, users: int,
                    defenses: tuple[str, ...], defense_file: str | None,
                    defense_seed: int | None, seed: int, protocol: ProtocolOptions) -> Any:
    """The victim the "Started victim" options describe, playing the audit game."""
    from fedleak.harness.federated.protocol import Protocol, ProtocolError
    from fedleak.harness.victim.settings import VictimSettings

    try:
        chosen = Protocol.from_options(protocol.values())
    except ProtocolError as err:
        raise click.UsageError(str(err)) from None
    return VictimSettings(dataset=dataset, model=model, split="all",
                          images=images, batch_size=batch_size, seed=seed,
                          protocol=chosen, defenses=tuple(defenses),
                          defense_file=defense_file, defense_seed=defense_seed,
                          users=users, audit=True)


def _against_started_victim(victim: Any, settings: Any, out: Path) -> Any:
    from fedleak.harness.attacker.client import VictimClient
    from fedleak.harness.attacker.games.audit_trials import run_audit
    from fedleak.harness.victim.process import VictimProcess, VictimProcessError

    score_token = secrets.token_hex(16)
    try:
        process = VictimProcess(victim, token=secrets.token_hex(16),
                                env={"FEDLEAK_SCORE_TOKEN": score_token}).start()
    except VictimProcessError as err:
        raise click.ClickException(str(err)) from None
    try:
        click.echo(f"victim started at {process.address} (pid {process.pid})")
        with VictimClient(process.address, score_token=score_token) as client:
            return run_audit(client, settings, out, log=click.echo)
    finally:
        process.stop()
