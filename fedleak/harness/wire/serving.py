"""Serving a fedleak gRPC service: health checking, reflection, binding, stopping on a signal.

The victim (``fedleak.v1.Victim``) and the out-of-process defense (``fedleak.v1.DefenseService``)
are served the same way: gRPC's asyncio server receiving every request on an event loop (a
stalled call holds no thread), a thread pool for the handlers, the standard health service
reporting SERVING for the server and for the named service, server reflection (so grpcurl and
grpc_health_probe work), and a bound port (0 picks a free one). :func:`serve_until_signal`
blocks until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fedleak.harness.wire.admission import Admission, ServingLimits
from fedleak.harness.wire.connections import (
    ConnectionCaps,
    PeerConnectionGuard,
    connection_ceiling,
    connection_quota,
    open_file_warning,
    raise_open_file_limit,
)
from fedleak.harness.wire.heap import return_large_frees_to_the_system

#: Set by a parent that starts a fedleak server: its pid, so the server can die with it.
PARENT_PID_ENV = "FEDLEAK_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (``prctl``
    ``PR_SET_PDEATHSIG``; strictly, when the parent *thread* that started it exits), so a parent
    killed with ``kill -9`` leaves no child behind; a no-op elsewhere. ``parent``: the pid the
    parent had, to catch a parent that died before the call (the process then stops at once).

    Called by the child itself, not in ``preexec_fn``: a ``preexec_fn`` forces ``fork``, and a
    process forked while gRPC channels are open can crash before it reaches ``exec``.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def die_with_parent_if_asked() -> None:
    """:func:`die_with_parent` when a fedleak parent asked for it (``FEDLEAK_PARENT_PID``)."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent and parent.isdigit():
        die_with_parent(parent=int(parent))


def bare_host(host: str) -> str:
    """``host`` without the brackets of an IPv6 literal (``[::1]`` → ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` as gRPC and clients read it: an IPv6 literal in brackets (``[::1]:50051``;
    ``::1:50051`` would be read as another address)."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1):
    only this machine can reach a server bound there. A name that does not resolve is not."""
    try:
        infos = socket.getaddrinfo(bare_host(host), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`OSError` when ``port`` is taken on any address ``host`` resolves to.

    gRPC binds every address of a name and succeeds when one of them binds: ``localhost`` on a
    port a 127.0.0.1 server holds binds ``::1`` alone, and clients of ``localhost:PORT`` then
    reach one server or the other. Each address is test-bound first (``SO_REUSEADDR``, so only
    a socket bound or listening there counts, not one in TIME_WAIT); an address family this
    machine lacks is skipped.
    """
    if port == 0:
        return
    host = bare_host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise OSError(f"cannot resolve host {host!r}: {err.strerror}; use an address of this "
                      "machine, e.g. 127.0.0.1") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise OSError(
                        f"port {port} is in use on {address[0]} ({host} resolves to "
                        f"{', '.join(sorted({str(i[4][0]) for i in infos}))}): another fedleak "
                        "process? stop it, or choose another with --port (--port 0 for a "
                        "free one)") from None
                # EADDRNOTAVAIL and the like: an address gRPC cannot bind either


def check_tls_pair(cert: bytes, key: bytes) -> None:
    """Raise :class:`ValueError` naming the problem when ``cert`` and ``key`` (PEM) are not a
    certificate and its private key (gRPC would only say that it could not bind)."""
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        key_file.chmod(0o600)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            reason = err.reason or str(err)
            if "MISMATCH" in reason.upper():
                raise ValueError("the TLS certificate and key do not match (--tls-cert, "
                                 "--tls-key): give the key the certificate was made for") \
                    from None
            raise ValueError(f"the TLS certificate or key cannot be read ({reason}): give PEM "
                             "files, --tls-cert the certificate and --tls-key its private "
                             "key") from None


def server_credentials(cert: bytes | None, key: bytes | None) -> grpc.ServerCredentials | None:
    """TLS credentials from a PEM certificate and key, checked to be a pair; None without."""
    if not (cert and key):
        return None
    check_tls_pair(cert, key)
    return grpc.ssl_server_credentials([(key, cert)])


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def serving_loop() -> asyncio.AbstractEventLoop:
    """The event loop every server of this process runs on, on its own daemon thread (started
    once): gRPC's asyncio layer keeps process-wide state bound to a loop, and servers on
    separate loops in one process (a victim and a defense service in a test) could hang."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.run_forever()

            threading.Thread(target=run, name="grpc-serving", daemon=True).start()
            _LOOP = loop
        return _LOOP


class Server:
    """A running fedleak server: gRPC's asyncio server on the process's serving loop.

    Requests are received on the event loop, so a client that opens calls and never sends
    their bodies holds no thread: a stalled call costs a coroutine, not a worker, and health,
    reflection and handlers written as coroutines (e.g. ``Describe``) keep answering however
    many calls stall. Handlers written as plain functions run on a pool of worker threads once
    their request has arrived (:mod:`fedleak.harness.wire.handlers`), behind ``admission``
    (calls per client and per address prefix, request memory, the receive deadline); ``guard``
    keeps each client host, each address prefix and all clients together within their
    connections, with a reserve below gRPC's quota kept free for new ones. ``warnings`` are
    what the operator should read (a low open-file limit). :meth:`stop` has the signature of
    ``grpc.Server.stop``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, server: grpc.aio.Server,
                 admission: Admission | None = None, guard: PeerConnectionGuard | None = None,
                 warnings: Sequence[str] = ()) -> None:
        self._loop = loop
        self._server = server
        self.admission = admission
        self.guard = guard
        self.warnings = list(warnings)

    def stop(self, grace: float | None) -> threading.Event:
        """Stop accepting calls, cancel those still running after ``grace`` seconds; the event
        is set once stopped."""
        if self.guard is not None:
            self.guard.stop()
        done = threading.Event()
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop)
        future.add_done_callback(lambda _: done.set())
        return done

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        future = asyncio.run_coroutine_threadsafe(
            self._server.wait_for_termination(timeout), self._loop)
        return bool(future.result())


#: HTTP/2 streams one connection may have open at once (the minimum RFC 9113 recommends);
#: calls a client may hold are capped per host by :class:`Admission`.
MAX_STREAMS_PER_CONNECTION = 100


def start_grpc_server(
    add_servicer: Callable[[grpc.aio.Server, futures.Executor, Admission], None],
    service_name: str,
    host: str,
    port: int,
    *,
    options: Sequence[tuple[str, int]] = (),
    credentials: grpc.ServerCredentials | None = None,
    workers: int = 4,
    limits: ServingLimits | None = None,
) -> tuple[Server, int]:
    """Start a server with ``add_servicer``'s service, health and reflection on ``host:port``.

    Returns the server and the bound port. Raises :class:`OSError` when the address cannot be
    bound (a port in use on any address the host resolves to, a host that is not this
    machine's). ``SO_REUSEPORT`` is off: gRPC's default lets a second server bind a port in
    use, and clients then reach one or the other at random — a leftover victim would silently
    answer for the new one. ``limits`` (:class:`ServingLimits`) cap what clients may hold:
    gRPC refuses a message above ``max_message_bytes`` from its declared length before
    buffering it; the open-file limit is raised and gRPC's connections capped below it
    (:mod:`fedleak.harness.wire.connections`).
    """
    limits = limits or ServingLimits()
    check_port_free(host, port)
    return_large_frees_to_the_system()
    files = raise_open_file_limit()
    admission = Admission(limits)
    address = host_port(host, port)

    async def start() -> tuple[grpc.aio.Server, int]:
        pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc")
        server = grpc.aio.server(pool, options=[
            *options, ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_allowed_incoming_connections", connection_quota(files.soft)),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION)])
        add_servicer(server, pool, admission)  # e.g. handlers.add_service: work on the pool
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ("", service_name):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        try:
            if credentials is not None:
                bound = server.add_secure_port(address, credentials)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            cause = (f"port {port} is in use (another fedleak process? stop it) or the host is "
                     "not this machine's" if port else "the host is not an address of this "
                     "machine")
            raise OSError(f"could not bind {address}: {cause}; choose another with --port, or "
                          "--port 0 for a free one")
        try:
            await server.start()
        except Exception as err:  # noqa: BLE001 - e.g. TLS credentials that do not load
            raise OSError(f"could not start serving on {address}: {err}") from None
        return server, bound

    loop = serving_loop()
    server, bound = asyncio.run_coroutine_threadsafe(start(), loop).result()
    caps = ConnectionCaps(limits.max_connections_per_peer, limits.connections_per_prefix,
                          connection_ceiling(files.soft))
    guard = PeerConnectionGuard([bound], caps, admission.connection_calls).start()
    warning = open_file_warning(files)
    return Server(loop, server, admission, guard, [warning] if warning else []), bound


class StopSignals:
    """SIGTERM and SIGINT recorded from the moment this is made (make it before starting a
    server, so a signal during start-up is not lost to the default handler).

    The handler only appends to a list: a handler that took a lock (``Event.set``) could
    deadlock with the main thread it interrupted while that thread held the same lock in
    ``Event.wait`` — a victim then ignored SIGTERM for ever.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.received.append(signum))


def serve_until_signal(server: Server, grace: float = 2.0,
                       stopping: threading.Event | None = None,
                       signals: StopSignals | None = None) -> None:
    """Block until SIGTERM or SIGINT, then stop the server, letting calls finish for ``grace`` s.

    ``stopping`` is set first, so running computations that watch it end at their next step;
    the server then cancels what is left. Work that still holds a thread ``grace`` seconds
    later cannot keep the process alive: the caller should exit right after this returns.
    """
    signals = signals or StopSignals()
    while not signals.received:
        time.sleep(0.2)
    if stopping is not None:
        stopping.set()
    server.stop(grace).wait(grace + 1)
