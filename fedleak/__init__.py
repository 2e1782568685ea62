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

from typing import TYPE_CHECKING, Any

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
