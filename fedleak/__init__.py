"""fedleak: measure how much private data leaks out of federated learning.

Layers (imports only point downwards): ``harness`` (processes, CLI, gRPC, the model and data
zoo, federated learning's semantics, metrics) may import ``attacks``, ``defenses`` and
``auditing``; those import torch only.

Short entry points, imported on first use:

- :func:`fedleak.observe` (:func:`fedleak.harness.federated.observe.observe`): the attack's
  threat model for one round in a notebook, without any process;
- :mod:`fedleak.flower` (``from fedleak.flower import LeakageAudit``): the Flower bridge's
  public names (``flwr`` is imported only when one is asked for).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any


def _die_with_a_fedleak_parent() -> None:
    """Die with the fedleak parent that started this process, from its first line.

    A parent that starts a fedleak server (a victim for a sweep, a test, the demo) sets
    ``FEDLEAK_PARENT_PID``; the child asks Linux at once, before torch, gRPC or click are
    imported, to send it SIGTERM when that parent dies (``prctl(PR_SET_PDEATHSIG)``), so a
    parent killed with ``kill -9`` during the child's seconds of imports leaves no orphan
    listening. The variable is taken out, so the child's own children do not read it; a parent
    already gone (pid changed) stops the child at once. A no-op elsewhere than Linux.
    """
    parent = os.environ.pop("FEDLEAK_PARENT_PID", "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # PR_SET_PDEATHSIG = 1
        return
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)


_die_with_a_fedleak_parent()

if TYPE_CHECKING:
    from fedleak.harness.federated.observe import observe

__version__ = "0.2.0"
__all__ = ["__version__", "observe"]


def __getattr__(name: str) -> Any:
    """``fedleak.observe`` imports the harness only when first asked for."""
    if name == "observe":
        from fedleak.harness.federated.observe import observe

        return observe
    raise AttributeError(f"module 'fedleak' has no attribute {name!r}")
