"""Memory a server frees goes back to the system (glibc; a no-op elsewhere).

Two glibc habits kept memory a server had let go:

- its mmap threshold rises each time a large mapped block is freed (up to 32 MiB), so the next
  blocks of that size come from the heap, whose freed middle is never returned: a cancelled
  512 MiB ``Defend`` stream left the service holding it. :func:`return_large_frees_to_the_system`
  fixes the threshold at start;
- gRPC receives a message into many small buffers, allocated in the heaps of its own threads;
  freed, they stay in those heaps (4 refused 250 MB ``Score`` calls left a victim 600 MB larger
  with nothing alive: ``malloc_trim`` gave it all back). :func:`return_freed_heap` is called
  when a large request's call ends (:mod:`fedleak.harness.wire.admission`) — after that
  request, not on a timer.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

#: ``mallopt`` parameter: allocations at least this large are served by ``mmap``.
_M_MMAP_THRESHOLD = -3
#: 256 KiB: received chunks (≤ 1 MiB) and decoded tensors are mapped, and unmapped when freed.
MMAP_THRESHOLD = 256 << 10


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def return_large_frees_to_the_system() -> None:
    """Fix glibc's mmap threshold, so large blocks a server frees are unmapped at once."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def return_freed_heap() -> None:
    """Give the free pages of every glibc heap back to the system (``malloc_trim(0)``)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
