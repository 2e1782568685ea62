"""Connections clients may hold of a server, and the open-file limit they draw on.

Every connection a server accepts is an open file. With the common soft limit of 1,024, a
client that opened about 1,200 connections (stalled calls, or bare idle HTTP/2 connections)
locked every new client out: gRPC could not accept and logged "File descriptor limit reached";
so did 768 stalled ``Describe`` calls from one host, and 16 stalled calls from each of 60
addresses (each within every per-host cap). The guards, as production gRPC servers and proxies
set them (a global connection ceiling below the file limit, per-source caps, idle and stalled
connections evicted first):

- :func:`raise_open_file_limit`, at start: the soft limit is raised to the hard one (the
  kernel's ``nr_open`` when the hard limit is unlimited), and :func:`open_file_warning` says
  so, with the figure, when it stays below :data:`LOW_OPEN_FILES`;
- :func:`connection_quota`: gRPC's own cap on connections at once
  (``grpc.max_allowed_incoming_connections``), :data:`RESERVED_FILES` below the limit: a
  connection past it is closed as it is accepted, so the server never runs out of files for
  its own use;
- :class:`PeerConnectionGuard` (:class:`ConnectionCaps`): at most ``per_host`` connections
  per client host, ``per_prefix`` per address prefix (a /24 of IPv4, a /64 of IPv6:
  :func:`~fedleak.harness.wire.admission.address_prefix`), and ``ceiling`` in all —
  :func:`connection_ceiling`, a *reserve* of :data:`RESERVE_FRACTION` of gRPC's quota below it,
  kept free for new connections (a fresh client's ``Describe`` and health check). gRPC reports
  no connections, so the guard reads the process's sockets from ``/proc`` (Linux; elsewhere it
  does nothing) every :data:`SWEEP_SECONDS`, and closes what is over a cap (``shutdown``: gRPC
  sees the peer leave, closes the socket and cancels its calls): first connections that carry
  no call (idle), then those whose every call still waits for its body (stalled), each oldest
  first; over the ceiling, from the prefix holding the most connections first. A connection
  with a call at work is never closed (the calls are capped on their own), and a new
  connection is never refused; one first seen in the latest sweep goes only when its host or
  prefix opened more than its cap since the sweep before (a flood reopening what it lost): a
  fresh client on a flooded host or network still gets its answer.
"""

from __future__ import annotations

import heapq
import ipaddress
import logging
import os
import socket
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedleak.harness.wire.admission import address_prefix

log = logging.getLogger(__name__)

#: Below this many open files a server warns at start.
LOW_OPEN_FILES = 4096
#: Files kept for the server's own use (data, libraries, pipes): not given to connections.
RESERVED_FILES = 256
#: How often the guard looks at the connections.
SWEEP_SECONDS = 0.2
#: The share of gRPC's connection quota kept free for new connections (the guard's ceiling on
#: the connections clients hold is the rest).
RESERVE_FRACTION = 0.25
_ESTABLISHED = "01"


@dataclass(frozen=True)
class OpenFiles:
    """The open-file limit after :func:`raise_open_file_limit`: ``soft`` (what counts), the
    ``hard`` ceiling, and the soft limit found at start."""

    soft: int
    hard: int
    before: int


try:
    import resource
except ImportError:  # not on Windows: no limit to raise
    resource = None  # type: ignore[assignment]

#: What the limit counts as when the system has none to read.
_UNLIMITED = 1 << 20


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return _UNLIMITED


def raise_open_file_limit() -> OpenFiles:
    """Raise this process's soft open-file limit as far as the hard limit allows."""
    if resource is None:
        return OpenFiles(_UNLIMITED, _UNLIMITED, _UNLIMITED)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        return OpenFiles(target, hard, soft)
    return OpenFiles(soft if soft != resource.RLIM_INFINITY else target, hard, soft)


def open_file_warning(files: OpenFiles) -> str | None:
    """What to tell the operator when the limit stays low (None when it is fine)."""
    if files.soft >= LOW_OPEN_FILES:
        return None
    hard = "unlimited" if resource is None or files.hard == resource.RLIM_INFINITY \
        else str(files.hard)
    return (f"WARNING: the open-file limit is {files.soft} (hard limit {hard}): this server "
            f"accepts at most {connection_quota(files.soft)} connections at once, and clients "
            "that hold them lock new ones out until they close. Raise the limit before "
            f"starting it (ulimit -n {LOW_OPEN_FILES * 16}, or LimitNOFILE= in a systemd "
            "unit).")


def connection_quota(soft: int) -> int:
    """Connections a server accepts at once with ``soft`` open files (gRPC closes the rest as
    it accepts them)."""
    return max(64, soft - RESERVED_FILES)


def connection_ceiling(soft: int) -> int:
    """Connections clients may hold at once with ``soft`` open files: gRPC's quota less the
    reserve for new connections (:data:`RESERVE_FRACTION`; 576 of 768 at 1,024 files)."""
    quota = connection_quota(soft)
    return quota - max(16, int(quota * RESERVE_FRACTION))


@dataclass(frozen=True)
class ConnectionCaps:
    """What :class:`PeerConnectionGuard` holds connections to: per client host, per address
    prefix, and in all (None: no cap)."""

    per_host: int
    per_prefix: int | None = None
    ceiling: int | None = None

    @property
    def smallest(self) -> int:
        return min(c for c in (self.per_host, self.per_prefix, self.ceiling) if c is not None)


# -- the process's TCP connections, from /proc ----------------------------------------------

def tcp_address(hex_address: str) -> tuple[str, int]:
    """(host, port) of an address as ``/proc/net/tcp`` and ``tcp6`` write it."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[::-1])
    else:  # four 32-bit words, each in host (little-endian) order
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


@dataclass(frozen=True)
class Connection:
    """One accepted TCP connection of this process: the client's host and port, and the
    socket's inode (increasing with creation) and file descriptor."""

    host: str
    port: int
    inode: int
    fd: int


def _socket_fds() -> dict[int, int]:
    """inode → file descriptor of every socket this process holds."""
    out: dict[int, int] = {}
    folder = "/proc/self/fd"
    for name in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def accepted_connections(ports: Iterable[int]) -> list[Connection]:
    """The established connections this process accepted on ``ports`` (Linux; [] elsewhere)."""
    if not sys.platform.startswith("linux"):
        return []
    return _connections(set(ports), _socket_fds())


def _connections(wanted: set[int], fds: dict[int, int]) -> list[Connection]:
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _ESTABLISHED:
                continue
            inode = int(fields[9])
            if inode not in fds:
                continue
            _, local_port = tcp_address(fields[1])
            if local_port not in wanted:
                continue
            host, port = tcp_address(fields[2])
            found.append(Connection(host, port, inode, fds[inode]))
    return found


def close_connection(connection: Connection) -> bool:
    """Shut ``connection`` down (its owner, gRPC, then closes it); False when its descriptor no
    longer holds that socket."""
    try:
        fd = os.dup(connection.fd)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_ino != connection.inode:  # the descriptor was reused meanwhile
            os.close(fd)
            return False
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False


def excess_connections(connections: list[Connection], cap: int,
                       busy: Iterable[tuple[str, int]],
                       first_seen: Mapping[int, int] | None = None, sweep: int = 0, *,
                       stalled: Iterable[tuple[str, int]] = (), per_prefix: int | None = None,
                       ceiling: int | None = None) -> list[Connection]:
    """The connections to close so that no host holds more than ``cap``, no address prefix
    more than ``per_prefix`` and all together no more than ``ceiling``.

    ``busy``: (host, port) of connections with a call at work, never closed; ``stalled``: of
    those whose calls all wait for their body, closed only after the idle ones (no call). With
    ``first_seen`` (inode → the sweep that first saw it), a connection first seen in this
    ``sweep`` is too new to judge (a new client about to make its call): the older ones go
    first, in the order they were first seen (otherwise in inode order), and a new one only
    when a host or prefix opened more than its cap since the last sweep (a flood that reopens
    what was closed). Over the ceiling, connections go from the prefix that holds the most
    first (one client's flood pays, not the network beside it).
    """
    seen = first_seen or {}
    working = set(busy) - set(stalled)
    waiting = set(stalled)

    def order(c: Connection) -> tuple[int, int, int, int]:
        new = seen.get(c.inode, sweep - 1) >= sweep
        return (int(new), 1 if (c.host, c.port) in waiting else 0, seen.get(c.inode, 0),
                c.inode)

    def evictable(c: Connection) -> bool:
        return (c.host, c.port) not in working

    closing: dict[int, Connection] = {}
    for key, limit in ((lambda c: c.host, cap), (lambda c: address_prefix(c.host), per_prefix)):
        if limit is None:
            continue
        groups: defaultdict[str, list[Connection]] = defaultdict(list)
        for connection in connections:
            if connection.inode not in closing:
                groups[key(connection)].append(connection)
        for held in groups.values():
            over = len(held) - limit
            if over > 0:
                for c in sorted(filter(evictable, held), key=order)[:over]:
                    closing[c.inode] = c
    left = [c for c in connections if c.inode not in closing]
    over = len(left) - ceiling if ceiling is not None else 0
    if over > 0:
        by_prefix: defaultdict[str, list[Connection]] = defaultdict(list)
        counts: Counter[str] = Counter()
        for c in left:
            counts[address_prefix(c.host)] += 1
            if evictable(c):
                by_prefix[address_prefix(c.host)].append(c)
        queues = {prefix: sorted(held, key=order, reverse=True)
                  for prefix, held in by_prefix.items()}
        heap = [(-counts[prefix], prefix) for prefix in queues]
        heapq.heapify(heap)
        while over > 0 and heap:
            count, prefix = heapq.heappop(heap)
            c = queues[prefix].pop()
            closing[c.inode] = c
            over -= 1
            if queues[prefix]:
                heapq.heappush(heap, (count + 1, prefix))
    return [c for c in connections if c.inode in closing]


class PeerConnectionGuard:
    """Keeps clients within ``caps`` on ``ports`` (see the module docstring); ``calls`` says
    which connections carry calls: (host, port) → whether one is at work (False: stalled, every
    call waits for its body)."""

    def __init__(self, ports: Iterable[int], caps: ConnectionCaps | int,
                 calls: Callable[[], Mapping[tuple[str, int], bool]]) -> None:
        self.ports = set(ports)
        self.caps = caps if isinstance(caps, ConnectionCaps) else ConnectionCaps(caps)
        self.calls = calls
        self.closed = 0
        self._sweeps = 0
        self._first_seen: dict[int, int] = {}  # inode → the sweep that first saw it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> list[Connection]:
        """Close what is over a cap now; the connections closed. A connection first seen in
        this sweep is kept until the next (it may be a new client about to make its call);
        older ones go in the order they were first seen."""
        self._sweeps += 1
        fds = _socket_fds()
        if len(fds) <= self.caps.smallest:  # no cap can be exceeded: skip reading the tables
            self._first_seen = {}
            return []
        current = _connections(self.ports, fds)
        self._first_seen = {c.inode: self._first_seen.get(c.inode, self._sweeps)
                            for c in current}
        calls = self.calls()
        closing = excess_connections(
            current, self.caps.per_host, calls, self._first_seen, self._sweeps,
            stalled=[address for address, at_work in calls.items() if not at_work],
            per_prefix=self.caps.per_prefix, ceiling=self.caps.ceiling)
        closed = [c for c in closing if close_connection(c)]
        self.closed += len(closed)
        return closed

    def start(self) -> PeerConnectionGuard:
        if sys.platform.startswith("linux") and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="connection-guard",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(SWEEP_SECONDS):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the guard must not die
                log.exception("connection guard sweep failed")
