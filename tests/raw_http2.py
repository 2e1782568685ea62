"""Hand-made HTTP/2 clients for hostile-load tests and benchmarks: an idle connection (the
client preface and nothing more), a call whose headers are sent and whose body never is, and a
whole unary call (:func:`unary_call`) — each from any local source address (``source``: e.g.
127.0.0.42, to stand for another client host), which gRPC's own client cannot choose.

They cost a socket each and no gRPC client state, so thousands fit in one process. Frames and
header blocks are built by hand (RFC 9113 §4.1, §6; HPACK literals without Huffman coding,
RFC 7541 §6.2.2): nothing here parses what the server answers.
"""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_STREAM, _END_HEADERS, _ACK = 0x1, 0x4, 0x1


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


def _connect(host: str, port: int, timeout: float, source: str | None = None) \
        -> socket.socket:
    address = (source, 0) if source else None
    sock = socket.create_connection((host, port), timeout=timeout, source_address=address)
    sock.sendall(PREFACE + frame(_SETTINGS, 0, 0) + frame(_SETTINGS, _ACK, 0))
    return sock


def idle_connection(host: str, port: int, timeout: float = 10.0,
                    source: str | None = None) -> socket.socket:
    """A connection that sent the client preface and SETTINGS, then nothing."""
    return _connect(host, port, timeout, source)


def _call_headers(host: str, port: int, path: str, stream: int = 1) -> bytes:
    block = b"".join(_literal(name, value) for name, value in (
        (":method", "POST"), (":scheme", "http"), (":path", path),
        (":authority", f"{host}:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers")))
    return frame(_HEADERS, _END_HEADERS, stream, block)


def another_stalled_stream(sock: socket.socket, host: str, port: int, path: str,
                           stream: int = 3) -> None:
    """One more stalled call (headers, no body) on the connection of :func:`stalled_call`
    (client streams have odd ids: 3, 5, ...)."""
    sock.sendall(_call_headers(host, port, path, stream))


def stalled_call(host: str, port: int, path: str, timeout: float = 10.0,
                 source: str | None = None) -> socket.socket:
    """A connection with one gRPC call (``path``, e.g. ``/fedleak.v1.Victim/Score``) whose
    headers were sent and whose request message never is."""
    sock = _connect(host, port, timeout, source)
    sock.sendall(_call_headers(host, port, path))
    return sock


def _read_frame(sock: socket.socket) -> tuple[int, int, int, bytes]:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionResetError("the server closed the connection")
            out += chunk
        return out

    head = exactly(9)
    length = int.from_bytes(head[:3], "big")
    stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    return head[3], head[4], stream, exactly(length)


def unary_call(host: str, port: int, path: str, request: bytes = b"",
               timeout: float = 1.0, source: str | None = None) -> bytes | None:
    """One whole unary gRPC call on a new connection (from ``source``): the response message,
    or None when none came within ``timeout`` seconds (refused, closed, reset, or too slow).
    gRPC answers an error without a message, so a message is an answer; the trailers are not
    decoded (HPACK's dynamic table is not kept here)."""
    try:
        sock = _connect(host, port, timeout, source)
    except OSError:
        return None
    with sock:
        try:
            message = b"\x00" + len(request).to_bytes(4, "big") + request
            sock.sendall(_call_headers(host, port, path) +
                         frame(_DATA, _END_STREAM, 1, message))
            received = b""
            while True:
                kind, flags, stream, payload = _read_frame(sock)
                if kind == _PING and not flags & _ACK:
                    sock.sendall(frame(_PING, _ACK, 0, payload))
                elif kind in (_GOAWAY, _RST_STREAM) and stream in (0, 1):
                    return None
                elif kind == _DATA and stream == 1:
                    received += payload
                    if len(received) >= 5 and \
                            len(received) >= 5 + int.from_bytes(received[1:5], "big"):
                        return received[5:5 + int.from_bytes(received[1:5], "big")]
                elif kind == _HEADERS and stream == 1 and flags & _END_STREAM:
                    return None  # trailers without a message: an error status
        except OSError:
            return None


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
