"""Serving a fedleak gRPC service: health checking, reflection, binding, stopping on a signal.

The victim (``fedleak.v1.Victim``) and the out-of-process defense (``fedleak.v1.DefenseService``)
are served the same way: a thread pool, the standard health service reporting SERVING for the
server and for the named service, server reflection (so grpcurl and grpc_health_probe work),
and a bound port (0 picks a free one). :func:`serve_until_signal` blocks until SIGTERM or SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

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


def start_grpc_server(
    add_servicer: Callable[[grpc.Server], None],
    service_name: str,
    host: str,
    port: int,
    *,
    options: Sequence[tuple[str, int]] = (),
    credentials: grpc.ServerCredentials | None = None,
    workers: int = 4,
) -> tuple[grpc.Server, int]:
    """Start a server with ``add_servicer``'s service, health and reflection on ``host:port``.

    Returns the server and the bound port. Raises :class:`OSError` when the address cannot be
    bound (a port in use, a host that is not this machine's). ``SO_REUSEPORT`` is off: gRPC's
    default lets a second server bind a port in use, and clients then reach one or the other
    at random — a leftover victim would silently answer for the new one.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[*options, ("grpc.so_reuseport", 0)])
    add_servicer(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", service_name):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{host}:{port}"
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"could not bind {address}: port {port} is in use (another fedleak "
                      "process? stop it) or the host is not this machine's; choose another "
                      "with --port, or --port 0 for a free one")
    server.start()
    return server, bound


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


def serve_until_signal(server: grpc.Server, grace: float = 2.0,
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
