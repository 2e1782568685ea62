"""Hand-made HTTP/2 clients for hostile-load tests and benchmarks: an idle connection (the
client preface and nothing more) and a call whose headers are sent and whose body never is.

They cost a socket each and no gRPC client state, so thousands fit in one process. Frames and
header blocks are built by hand (RFC 9113 §4.1, §6; HPACK literals without Huffman coding,
RFC 7541 §6.2.2): nothing here parses what the server answers.
"""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS, _SETTINGS = 0x1, 0x4
_END_HEADERS, _ACK = 0x4, 0x1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream & 0x7FFFFFFF) + payload


def _length(n: int) -> bytes:
    """An HPACK string length (7-bit prefix integer, no Huffman bit)."""
    if n < 127:
        return bytes([n])
    out, n = bytearray([127]), n - 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, new name (RFC 7541 §6.2.2)."""
    return b"\x00" + _length(len(name)) + name.encode() + _length(len(value)) + value.encode()


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(PREFACE + frame(_SETTINGS, 0, 0) + frame(_SETTINGS, _ACK, 0))
    return sock


def idle_connection(host: str, port: int, timeout: float = 10.0) -> socket.socket:
    """A connection that sent the client preface and SETTINGS, then nothing."""
    return _connect(host, port, timeout)


def stalled_call(host: str, port: int, path: str, timeout: float = 10.0) -> socket.socket:
    """A connection with one gRPC call (``path``, e.g. ``/fedleak.v1.Victim/Score``) whose
    headers were sent and whose request message never is."""
    sock = _connect(host, port, timeout)
    block = b"".join(_literal(name, value) for name, value in (
        (":method", "POST"), (":scheme", "http"), (":path", path),
        (":authority", f"{host}:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers")))
    sock.sendall(frame(_HEADERS, _END_HEADERS, 1, block))
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection (reads what it sent until the end; False
    when it is still open after the socket's timeout)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (TimeoutError, BlockingIOError):
        return False
