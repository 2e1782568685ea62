"""Training-mode batch norm written out in elementary operations, for vectorised replays.

``torch.func.vmap`` over the double backward of ``F.batch_norm`` in training mode returns a
wrong derivative (torch 2.13): for the ConvNet of Inverting Gradients, the image gradient of
⟨u(x), c⟩ — the quantity every optimisation attack follows — differs from central finite
differences by 9e-4 relative in float64, while the sequential replay agrees to 1e-10
(``tests/attacks/optimisation/test_restarts.py``). Inside :func:`decomposed_batch_norm` the replay
computes training-mode batch norm as

    y = (x − μ_B) / √(σ²_B + ε) · γ + β,   μ_B, σ²_B = mean and biased variance over (N, H, W),

in elementary operations whose derivatives of every order compose correctly under ``vmap``, so
models with training-mode BatchNorm vectorise their restarts and pack like the others. The
running statistics are left as they are: in training mode they do not enter the output, and
they are never part of the user's update. Evaluation-mode batch norm (running statistics) is
untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode


def batch_norm_train(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    """Batch norm with the batch's statistics over every dimension but the channels (1)."""
    dims = [d for d in range(x.dim()) if d != 1]
    mean = x.mean(dim=dims, keepdim=True)
    var = (x - mean).square().mean(dim=dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    shape = [1, -1] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


class _DecomposedMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.batch_norm:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training",
                     "momentum", "eps")
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            if given.get("training", False):
                return batch_norm_train(given["input"], given.get("weight"), given.get("bias"),
                                        given.get("eps", 1e-5))
        return func(*args, **kwargs)


@contextmanager
def decomposed_batch_norm() -> Iterator[None]:
    """Inside: training-mode ``F.batch_norm`` is :func:`batch_norm_train`."""
    with _DecomposedMode():
        yield
