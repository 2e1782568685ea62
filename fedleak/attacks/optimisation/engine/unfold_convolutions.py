"""Convolutions written as im2col and a matrix product, for the compiled step.

A 2-D convolution of ``x`` ``[n, C, H, W]`` with ``W`` ``[O, C, k_h, k_w]`` and bias ``b`` is

    y[:, o, i, j] = Σ_{c, p, q} W[o, c, p, q] · x_pad[:, c, s_h i + d_h p, s_w j + d_w q] + b[o],

that is ``Y = W_mat · cols(x) + b`` with ``W_mat`` the ``O × (C k_h k_w)`` reshape of ``W`` and
``cols(x)`` the ``(C k_h k_w) × (H' W')`` patch matrix (``torch.nn.functional.unfold``, im2col).
The two are the same function; what differs is what a compiler sees. Left as a convolution,
TorchInductor calls an external kernel for it (ATen's ``slow_conv2d`` or oneDNN) and for each
of its derivatives: the attack's iteration of a LeNet on one 32×32 image makes 19 such calls
(the forward, the user's backward, the attack's double backward), 20–25 µs each whatever the
arithmetic. Written as ``unfold`` and ``@``, every derivative is an index gather or scatter
(``unfold``'s adjoint is ``fold``) or a matrix product, and Inductor fuses the gathers and
scatters into its own loops. Measured (``bench/engine_speed.py --engine-options compile=on``,
one thread, the project's 2-core AMD EPYC, quiet, lenet-zhu on one image): 1.02 ms an
iteration with the convolutions, 0.84 ms with this, 0.75 ms with this and Inductor's C++
wrapper (:mod:`~fedleak.attacks.optimisation.engine.compiled`).

:class:`UnfoldConvolutions` is a ``TorchFunctionMode``: inside it every
``torch.nn.functional.conv2d`` with one group and zero padding given as numbers is computed as
above (Dynamo traces through the mode); any other convolution (groups, ``padding="same"``,
1-D or 3-D) runs as it would outside. The sums are ordered differently from a convolution
kernel's: equal to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_CONV2D: tuple[Callable[..., Any], ...] = (F.conv2d, torch.conv2d)


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def unfold_conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                  dilation: int | Sequence[int] = 1) -> torch.Tensor:
    """Compute ``torch.nn.functional.conv2d`` of one group as ``W_mat · cols(x) + b``.

    The module docstring has the maths; ``input`` is ``[n, C, H, W]`` (or ``[C, H, W]``).
    """
    if input.dim() == 3:
        return unfold_conv2d(input.unsqueeze(0), weight, bias, stride, padding,
                             dilation).squeeze(0)
    n, _, height, width = input.shape
    out_channels, _, kh, kw = weight.shape
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = F.unfold(input, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))
    out = weight.reshape(out_channels, -1) @ cols
    if bias is not None:
        out = out + bias.view(1, out_channels, 1)
    return out.view(n, out_channels, out_h, out_w)


def _unfoldable(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Say whether :func:`unfold_conv2d` computes this ``conv2d`` call.

    That is: a 4-D weight, one group, padding given as numbers, no other keyword.
    """
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    call = {**dict(zip(names, args, strict=False)), **kwargs}
    weight, padding = call.get("weight"), call.get("padding", 0)
    return (isinstance(weight, torch.Tensor) and weight.dim() == 4
            and call.get("groups", 1) == 1 and not isinstance(padding, str)
            and set(call) <= set(names))


class UnfoldConvolutions(TorchFunctionMode):
    """Inside this mode, 2-D convolutions of one group run as :func:`unfold_conv2d`."""

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
                           ) -> Any:
        """Run ``func``, a 2-D convolution of one group as :func:`unfold_conv2d`."""
        kwargs = kwargs or {}
        if func in _CONV2D and _unfoldable(args, kwargs):
            call = dict(kwargs)
            call.pop("groups", None)
            positional = list(args[:6])
            return unfold_conv2d(*positional, **call)
        return func(*args, **kwargs)
