"""Why a peer did not answer: nothing listening, a TLS mismatch, or a TLS certificate problem.

gRPC reports all of these as one timeout ("no victim answered"). When waiting fails, the
client (the attacker's, or the victim's link to a defense service) probes the address itself
with a plain TCP connection and a TLS handshake (the standard library's ``ssl``), so the
message names the cause: a peer serving TLS to a plaintext client (pass ``--tls-ca``), a
plaintext peer given ``--tls-ca`` (drop it), or a certificate the given CA does not verify
(with the handshake's own reason).
"""

from __future__ import annotations

import socket
import ssl


def split_address(address: str, peer: str = "victim") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); a clear ``ValueError`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{peer} address {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051); "
                         f"give the port the {peer} printed when it started")
    return host.strip("[]"), int(port)


def diagnose(address: str, tls_ca: bytes | None, timeout: float = 3.0,
             peer: str = "victim") -> str:
    """A sentence saying why ``address`` did not answer a gRPC client (best effort)."""
    try:
        host, port = split_address(address)
        raw = socket.create_connection((host, port), timeout=timeout)
    except ValueError as err:
        return str(err)
    except OSError as err:
        return (f"nothing accepts connections at {address} ({err.strerror or err}); is the "
                f"{peer} running there, on that port?")
    with raw:
        if tls_ca is None:
            return _plaintext_client(raw, host, address, peer)
        return _tls_client(raw, host, address, tls_ca, peer)


def _plaintext_client(raw: socket.socket, host: str, address: str, peer: str) -> str:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(raw, server_hostname=host):
            return (f"the {peer} at {address} speaks TLS but this client does not: give it "
                    f"the certificate that signed the {peer}'s --tls-cert (--tls-ca)")
    except (ssl.SSLError, OSError):
        return (f"something listens at {address} but does not answer as a fedleak {peer} "
                "(a plaintext gRPC client got no reply); check the address")


def _tls_client(raw: socket.socket, host: str, address: str, tls_ca: bytes, peer: str) -> str:
    try:
        context = ssl.create_default_context(cadata=tls_ca.decode("ascii", "replace"))
    except ssl.SSLError as err:
        return f"--tls-ca is not a PEM certificate ({err.reason or err}); give the PEM file"
    try:
        with context.wrap_socket(raw, server_hostname=host):
            return (f"the TLS handshake with {address} succeeds but gRPC got no answer; check "
                    "that the victim's certificate names this host")
    except ssl.SSLCertVerificationError as err:
        return (f"TLS: the {peer}'s certificate at {address} is not verified by the given CA "
                f"(--tls-ca; {err.verify_message or err.reason}); give the certificate (or CA) "
                f"that signed the {peer}'s --tls-cert, for the host name you connect to")
    except ssl.SSLError as err:
        reason = err.reason or str(err)
        if "WRONG_VERSION_NUMBER" in reason.upper() or "RECORD" in reason.upper():
            return (f"the {peer} at {address} does not speak TLS ({reason}); drop --tls-ca, "
                    f"or start the {peer} with --tls-cert/--tls-key")
        return f"TLS handshake with {address} failed: {reason}"
    except OSError as err:
        return f"TLS handshake with {address} failed: {err}"
