"""Who a gRPC peer is: its host, its address, and the network it counts in.

gRPC names a client by a peer string (``ipv4:10.0.0.5:5000``, ``ipv6:[::1]:5000``, possibly
percent-encoded, ``unix:...``); the per-client caps of :mod:`fedleak.harness.wire.admission`
and :mod:`fedleak.harness.wire.connections` count by its host and by its address prefix (a /24
of IPv4, a /64 of IPv6: what one client can own).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote


def peer_host(peer: str) -> str:
    """The client host of a gRPC peer string: ``ipv4:10.0.0.5:5000`` → ``10.0.0.5``,
    ``ipv6:[::1]:5000`` (or percent-encoded) → ``::1``; ``unix:...`` → ``unix``."""
    kind, _, rest = unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0] if "]" in rest else rest
        host = host.strip("[]")
        return host[7:] if host.startswith("::ffff:") and "." in host else host
    return kind or peer


def address_prefix(host: str) -> str:
    """The network ``host`` counts in for the per-prefix caps: its /24 for IPv4, its /64 for
    IPv6 (what one client can own: a subscriber's IPv6 allocation is a /64 or more); a host
    that is not an IP address (``unix``) is its own prefix."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


def peer_address(peer: str) -> tuple[str, int] | None:
    """(host, port) of a TCP peer string, None for another transport."""
    host = peer_host(peer)
    tail = unquote(peer).rsplit(":", 1)[-1]
    return (host, int(tail)) if tail.isdigit() and peer.startswith(("ipv4", "ipv6")) else None
