"""``fedleak informed-adversary``: play the informed-adversary game against a running victim.

    fedleak victim serve --dataset digits --model mlp:width=16 --split train \\
        --defense dpsgd:noise-multiplier=1 --informed-candidates 10 --port 50051
    fedleak informed-adversary --victim 127.0.0.1:50051 --trials 200 --out runs/informed

The victim picks each trial's target among public candidates with its secret coin; this
process (the server) runs the prior-aware attack and the victim scores each guess. The
success rate and its interval are written beside the DP bound of the same mechanism.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from fedleak.harness.cli.attacker_errors import attacker_errors
from fedleak.harness.cli.options import TokenOptions, token_options


@click.command("informed-adversary")
@click.option("--victim", "address", required=True,
              help="Address HOST:PORT of a victim started with --informed-candidates N.")
@click.option("--trials", default=100, show_default=True, type=click.IntRange(1),
              help="Trials to play (each: one update, one final guess).")
@click.option("--bound-samples", default=200_000, show_default=True,
              type=click.IntRange(1000),
              help="Monte Carlo samples for the bound of a Poisson-subsampled mechanism.")
@click.option("--seed", default=0, show_default=True, help="Seeds the bound's Monte Carlo.")
@token_options
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM root certificate to verify a TLS victim.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/informed-adversary-TIMESTAMP).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def informed_adversary(address: str, trials: int, bound_samples: int, seed: int,
                       tokens: TokenOptions, tls_ca: str | None, out: str | None,
                       quiet: bool) -> None:
    """Measure the prior-aware attack's success against the DP bound that caps it.

    Threat model (Balle et al. 2022): the server knows the N public candidates, every other
    record of the user's batch and the mechanism; only the victim knows which candidate is the
    target. The bound is reconstruction robustness (Hayes et al. 2023) at κ = 1/N.
    """
    from fedleak.harness.attacker.client import VictimClient
    from fedleak.harness.attacker.games.informed_adversary import play

    run_dir = Path(out) if out else \
        Path("runs") / f"informed-adversary-{datetime.now():%Y%m%d-%H%M%S}"
    ca = Path(tls_ca).read_bytes() if tls_ca else None
    token, score_token = tokens.read()
    try:
        client = VictimClient(address, token=token, tls_ca=ca, score_token=score_token)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--victim") from None
    with client:
        with attacker_errors(address, f"the trials played are in {run_dir / 'metrics.json'}"):
            client.wait_ready(timeout=15)
            run = play(client, trials, run_dir, show_progress=not quiet,
                       bound_samples=bound_samples, seed=seed)
    for line in run.summary_lines(run_dir):
        click.echo(line)
