"""fedleak: measure how much private data leaks out of federated learning.

Layers (imports only point downwards): ``harness`` (processes, CLI, gRPC, data, models,
protocol, metrics) may import ``attacks`` and ``defenses``; those two import torch only.
"""

__version__ = "0.2.0"
