"""How the victim is served, not which victim: "Address and access", "Tokens" and "Wire
limits" of ``fedleak victim serve --help``, the only options ``--settings`` leaves open."""

from __future__ import annotations

from dataclasses import dataclass

import click

from fedleak.harness.cli.help_sections import Section, section_names
from fedleak.harness.cli.options import DEFAULT_PORT, F, TokenOptions, packed, token_options

#: Defaults of the serving caps (fedleak.harness.wire.admission; literals here so the CLI
#: starts without importing gRPC).
DEFAULT_MAX_CALLS_PER_PEER = 16
DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
DEFAULT_RECEIVE_TIMEOUT = 60.0


@dataclass(frozen=True)
class AddressOptions:
    """Where the victim listens, with what TLS, and who may call Score."""

    host: str
    port: int
    tls_cert: str | None
    tls_key: str | None
    open_score: bool


def address_options(function: F) -> F:
    """The address options, handed to the command as ``address``."""
    return packed(AddressOptions, "address", [
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind."),
        click.option("--port", default=DEFAULT_PORT, show_default=True,
                     type=click.IntRange(0, 65535),
                     help="Port to bind; 0 picks a free one (the bound address is printed)."),
        click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="PEM certificate for TLS (with --tls-key); use for non-loopback "
                          "hosts."),
        click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="PEM private key of --tls-cert."),
        click.option("--open-score", is_flag=True,
                     help="On a non-loopback --host, let any client that holds a round id call "
                          "Score without the score token (round ids are bearer tokens). By "
                          "default such a victim requires --score-token, and makes one up when "
                          "none is given."),
    ])(function)


@dataclass(frozen=True)
class WireLimitOptions:
    """What clients may hold of the victim: message sizes, memory in flight, calls, time."""

    max_message_mb: int | None
    request_memory_mb: int | None
    max_calls_per_peer: int
    max_connections_per_peer: int
    max_calls_per_prefix: int | None
    max_connections_per_prefix: int | None
    receive_timeout: float


def wire_limit_options(function: F) -> F:
    """The wire limits, handed to the command as ``wire``."""
    return packed(WireLimitOptions, "wire", [
        click.option("--max-message-mb", default=None, type=click.IntRange(1, 2047),
                     help="Largest gRPC message accepted or sent; a larger request is refused "
                          "from its declared length before it is received. Default: twice what "
                          "this victim's model and data need, at least 64 (Describe publishes "
                          "it)."),
        click.option("--request-memory-mb", default=None, type=click.IntRange(1),
                     help="Memory that request bodies in flight may hold, all clients together "
                          "(one client host at most half); a request waits (unread) while it is "
                          "full. Default: room for four requests of --max-message-mb (each "
                          "counted 4 times: the copies it takes to receive and decode)."),
        click.option("--max-calls-per-peer", default=DEFAULT_MAX_CALLS_PER_PEER,
                     show_default=True, type=click.IntRange(1),
                     help="Calls one client host may have in flight (Describe and health "
                          "aside); more are refused with RESOURCE_EXHAUSTED."),
        click.option("--max-connections-per-peer", default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
                     show_default=True, type=click.IntRange(1),
                     help="Connections one client host may hold; beyond it its oldest idle "
                          "(then stalled) ones are closed."),
        click.option("--max-calls-per-prefix", default=None, type=click.IntRange(1),
                     help="Calls in flight of one address prefix (a /24 of IPv4, a /64 of IPv6) "
                          "together. Default: 4 x --max-calls-per-peer."),
        click.option("--max-connections-per-prefix", default=None, type=click.IntRange(1),
                     help="Connections one address prefix (/24, /64) may hold together; beyond "
                          "it its oldest idle (then stalled) ones are closed. Default: 4 x "
                          "--max-connections-per-peer."),
        click.option("--receive-timeout", default=DEFAULT_RECEIVE_TIMEOUT, show_default=True,
                     type=click.FloatRange(0, min_open=True),
                     help="Seconds a request body may take to arrive after its call began "
                          "(then DEADLINE_EXCEEDED)."),
    ])(function)


@dataclass(frozen=True)
class ServingOptions:
    """How to serve the victim, by concern."""

    address: AddressOptions
    tokens: TokenOptions
    wire: WireLimitOptions


def serving_options(function: F) -> F:
    """Every serving option, handed to the command as ``serving``."""
    return packed(ServingOptions, "serving",
                  [address_options, token_options, wire_limit_options])(function)


#: The headings of the serving options in ``--help``, in order.
SERVING_SECTIONS: tuple[Section, ...] = (
    ("Address and access", AddressOptions), ("Tokens", TokenOptions),
    ("Wire limits", WireLimitOptions))


def serving_names() -> frozenset[str]:
    """The parameter names of every serving option (what ``--settings`` leaves open)."""
    return frozenset(name for _, into in SERVING_SECTIONS for name in section_names(into))
