"""``fedleak defense serve``: run a registered update defense as an out-of-process service.

    fedleak defense serve --port 50061 --defense prune:p=0.9
    fedleak victim serve --defense remote:address=127.0.0.1:50061

Registered on the ``fedleak`` group by :mod:`fedleak.harness.cli.main`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

DEFAULT_DEFENSE_PORT = 50061


@click.group("defense")
def defense() -> None:
    """Defenses that run out of process, behind fedleak.v1.DefenseService."""


@defense.command("serve")
@click.option("--defense", "spec", required=True, metavar="NAME:KEY=VALUE,...",
              help="The update defense to serve, e.g. clip:max-norm=1 or noise:sigma=0.01 "
                   "(`fedleak list` shows them; per-example and transport defenses cannot "
                   "run out of process).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=DEFAULT_DEFENSE_PORT, show_default=True,
              type=click.IntRange(0, 65535),
              help="Port to bind; 0 picks a free one (the bound address is printed).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM certificate for TLS (with --tls-key); victims then link with "
                   "remote:address=HOST:PORT,tls-ca=CERT.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None)
@click.option("--max-update-mb", default=1024, show_default=True, type=click.IntRange(1),
              help="Largest update one Defend stream may send (MiB); a longer stream is "
                   "refused with RESOURCE_EXHAUSTED and dropped.")
@click.option("--receive-timeout", default=60.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="Seconds a Defend stream may pause between chunks before it is refused "
                   "with DEADLINE_EXCEEDED and dropped.")
@click.option("--max-calls-per-peer", default=16, show_default=True, type=click.IntRange(1),
              help="Calls one client host may have in flight (Info and health aside); more "
                   "are refused with RESOURCE_EXHAUSTED.")
@click.option("--max-connections-per-peer", default=64, show_default=True,
              type=click.IntRange(1),
              help="Connections one client host may hold; beyond it its oldest idle ones are "
                   "closed.")
def defense_serve(spec: str, host: str, port: int, tls_cert: str | None,
                  tls_key: str | None, max_update_mb: int, receive_timeout: float,
                  max_calls_per_peer: int, max_connections_per_peer: int) -> None:
    """Serve one update defense until SIGTERM or SIGINT; victims use it with
    --defense remote:address=HOST:PORT."""
    from fedleak.defenses import parse_defense_spec
    from fedleak.harness.remote_defense.defense_server import served_defense, start_defense_server
    from fedleak.harness.wire.serving import (
        StopSignals,
        die_with_parent_if_asked,
        host_port,
        serve_until_signal,
    )

    signals = StopSignals()  # from the start: a SIGTERM while starting is not lost
    die_with_parent_if_asked()  # started by a test or a script: die with that parent

    try:
        name, params = parse_defense_spec(spec)
        served = served_defense(name, params)
    except ValueError as err:  # DefenseConfigError
        raise click.UsageError(str(err)) from None
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    cert = Path(tls_cert).read_bytes() if tls_cert else None
    key = Path(tls_key).read_bytes() if tls_key else None
    try:
        server, bound = start_defense_server(served, host, port, tls_cert=cert, tls_key=key,
                                             max_update_bytes=max_update_mb << 20,
                                             receive_timeout=receive_timeout,
                                             max_calls_per_peer=max_calls_per_peer,
                                             max_connections_per_peer=max_connections_per_peer)
    except (OSError, RuntimeError, ValueError) as err:
        raise click.ClickException(f"cannot listen on {host_port(host, port)}: {err}") \
            from None
    for warning in server.warnings:
        click.echo(warning, err=True)
    shown = ", ".join(f"{k}={v}" for k, v in served.public_params().items())
    click.echo(f"fedleak defense service listening on {host_port(host, bound)} ({served.name}: "
               f"{shown})")
    sys.stdout.flush()
    serve_until_signal(server, signals=signals)
    click.echo("fedleak defense service stopped", err=True)
