"""``fedleak victim serve``: the federated user as a gRPC service, until SIGTERM or SIGINT.

    fedleak victim serve --dataset photos --model lenet-zhu --port 0 --allow-reveal
    fedleak victim serve --settings victim.json --port 0      # settings a sweep wrote

The command takes its options by concern (:class:`~fedleak.harness.cli.victim.victim_options.
VictimOptions`, :class:`~fedleak.harness.cli.victim.serving_options.ServingOptions`), and
``--help`` lists them under one heading each; the victim's become one
:class:`~fedleak.harness.victim.settings.VictimSettings` in ``settings.py``, and nowhere else.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fedleak.harness.cli.help_sections import SectionedCommand
from fedleak.harness.cli.options import SCORE_TOKEN_ENV, TOKEN_ENV, check_device
from fedleak.harness.cli.victim.option_settings import settings_file, victim_settings
from fedleak.harness.cli.victim.serving_options import (
    SERVING_SECTIONS,
    ServingOptions,
    serving_options,
)
from fedleak.harness.cli.victim.victim_options import VICTIM_SECTIONS, VictimOptions, victim_options
from fedleak.harness.cli.victim.victim_serving import (
    required_score_token,
    serving_limits,
    start_warnings,
)

if TYPE_CHECKING:  # the CLI starts without importing the victim
    from fedleak.harness.victim.federated_victim import Victim
    from fedleak.harness.victim.settings import VictimSettings
    from fedleak.harness.wire.serving import Server


@click.group()
def victim() -> None:
    """The federated user (victim) process."""


@victim.command("serve", cls=SectionedCommand, sections=(*VICTIM_SECTIONS, *SERVING_SECTIONS))
@click.option("--settings", "settings_file", type=click.Path(dir_okay=False, exists=True),
              default=None,
              help="JSON file of victim settings (as `fedleak sweep` writes them) instead of "
                   "the data, model, protocol and defense options below.")
@victim_options
@serving_options
@click.pass_context
def victim_serve(ctx: click.Context, settings_file: str | None, victim: VictimOptions,
                 serving: ServingOptions) -> None:
    """Serve a federated user over gRPC until SIGTERM or SIGINT."""
    from fedleak.harness.wire.serving import StopSignals, die_with_parent_if_asked

    signals = StopSignals()  # from the start: a SIGTERM while starting is not lost
    die_with_parent_if_asked()  # started by demo, a sweep or a test: die with that parent
    from fedleak.harness.victim.settings import create_victim
    from fedleak.harness.wire.serving import host_port, serve_until_signal

    settings = _settings(ctx, settings_file, victim)
    check_device(settings.device)  # --device cuda on a torch without CUDA: a usage error
    token, score_token = _tokens(settings.reveal, serving)
    try:
        v = create_victim(settings)
    except ValueError as err:  # DatasetError, ModelError, DefenseConfigError, SetupError
        raise click.UsageError(str(err)) from None
    server, bound, stopping = _listen(v, serving, token, score_token)
    for warning in [*start_warnings(v), *server.warnings]:
        click.echo(warning, err=True)
    chain = v.config.defenses
    click.echo(f"fedleak victim listening on {host_port(serving.address.host, bound)} "
               f"({v.info.name}, {len(v.data.labels)} private "
               f"{'images' if v.info.mean else 'sentences'}, {v.config.model}, "
               f"{settings.protocol.kind}, n={v.config.num_images}, defenses: "
               f"{', '.join(d.name for d in chain.defenses) or 'none'})", err=False)
    sys.stdout.flush()
    serve_until_signal(server, stopping=stopping, signals=signals)
    click.echo("fedleak victim stopped", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a computation that ignored the stop must not keep the process alive


def _settings(ctx: click.Context, path: str | None, victim: VictimOptions) -> VictimSettings:
    """The victim to serve: the ``--settings`` file's, or the one the options describe."""
    from fedleak.harness.victim.settings import SetupError
    from fedleak.harness.zoo.user_models import is_factory, trust

    try:
        if is_factory(victim.model.model):
            trust(victim.model.model)  # this process's user named it
        return settings_file(ctx, path) if path else victim_settings(victim)
    except (ValueError, SetupError) as err:  # ProtocolError, ReleaseSettings, SetupError
        raise click.UsageError(str(err)) from None


def _tokens(reveal: bool, serving: ServingOptions) -> tuple[str | None, str | None]:
    """(token, score token): as given, or made up (and printed) where the victim needs one."""
    token, score_token = serving.tokens.read()
    if reveal and not token:
        token = secrets.token_hex(16)
        click.echo(f"reveal token (pass as --token or ${TOKEN_ENV}): {token}", err=True)
    address = serving.address
    score_token, made_up = required_score_token(address.host, score_token, address.open_score)
    if made_up:
        click.echo(f"score token (give it to the evaluator as --score-token or "
                   f"${SCORE_TOKEN_ENV}; --open-score to go without): {score_token}", err=True)
    return token, score_token


def _listen(v: Victim, serving: ServingOptions, token: str | None,
            score_token: str | None) -> tuple[Server, int, threading.Event]:
    """Start serving ``v`` where the options say: (server, bound port, its stop event)."""
    from fedleak.harness.victim.server import start_server
    from fedleak.harness.wire.serving import host_port

    address = serving.address
    if bool(address.tls_cert) != bool(address.tls_key):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    cert = Path(address.tls_cert).read_bytes() if address.tls_cert else None
    key = Path(address.tls_key).read_bytes() if address.tls_key else None
    limits = serving_limits(v, serving.wire)
    stopping = threading.Event()
    try:
        server, bound = start_server(v, address.host, address.port, token, tls_cert=cert,
                                     tls_key=key, score_token=score_token, stopping=stopping,
                                     limits=limits)
    except (OSError, RuntimeError, ValueError) as err:
        raise click.ClickException(f"cannot listen on {host_port(address.host, address.port)}: "
                                   f"{err}") from None
    return server, bound, stopping
