"""Lean second derivatives of ``conv2d`` and ``batch_norm`` for the attacker's replay.

Gradient-matching attacks differentiate the user's update ``u(x) = ∇_θ L(x)`` with respect to
the images x (double back-propagation). PyTorch's built-in second derivatives of these two
layers do more work than that needs:

- ``convolution_backward``'s derivative (``_convolution_double_backward``) always computes the
  weight term ``corr(ggI, gO)`` once the input-gradient cotangent ``ggI`` exists, ignoring the
  engine's output mask: one wasted convolution per layer and iteration, because the attack asks
  for ∂/∂x only and the global weights are constants;
- ``batchnorm_double_backward`` spends ~80 tensor ops per layer.

Inside :func:`lean_second_order` the forward calls ``torch.conv2d`` (of at least
:data:`LEAN_CONV_MIN_MACS` multiply-adds) and training-mode ``F.batch_norm`` on CPU tensors go
through the custom autograd functions below; everything else, and every CUDA tensor, keeps
PyTorch's own derivatives. Their forward and first derivatives call the same ATen kernels as
PyTorch (``convolution``, ``convolution_backward``, ``native_batch_norm``,
``native_batch_norm_backward``), so the replayed update is bit-identical; their second
derivatives compute only the terms the autograd engine will use, with these formulas.

Convolution ``y = conv(x, W)``, first derivatives ``gI = convᵀ(gO; W)``, ``gW = corr(x, gO)``.
With cotangents ``(ggI, ggW)``:

    ∂/∂gO = conv(ggI, W) + conv(x, ggW) (+ ggb),   ∂/∂x = convᵀ(gO; ggW),   ∂/∂W = corr(ggI, gO).

Batch normalisation in training mode, per channel over the M = N·H·W values: μ, σ² (biased),
r = (σ² + ε)^{-1/2}, x̂ = (x − μ) r, y = γ x̂ + β, ⟨·⟩ the channel mean and
``P(v) = v − ⟨v⟩ − x̂ ⟨v x̂⟩`` (self-adjoint). First derivatives: ``gx = γ r P(gO)``,
``gγ = Σ gO x̂``, ``gβ = Σ gO``. Using ``d x̂ = r P(dx)`` and ``d r = −r² ⟨x̂ dx⟩``, with
cotangents ``(ggx, ggγ, ggβ)``, ``U = ⟨gO x̂⟩``, ``V = ⟨ggx x̂⟩`` and ``K = Σ ggx P(gO)``:

    ∂/∂gO = γ r P(ggx) + ggγ x̂ + ggβ
    ∂/∂x  = −γ r² (x̂ K / M + U P(ggx) + V P(gO)) + ggγ r P(gO)
    ∂/∂γ  = r K

Whether a weight term is needed is asked from the engine
(``torch._C._will_engine_execute_node``); while the replay computes its own first-order
gradient (inside the context) every parameter gradient is needed by definition. The second
derivatives are not differentiable again: asking for third derivatives through the replay
(``create_graph=True`` on the attack's backward pass) raises an error instead of being wrong.
The functions use the ``forward(ctx, ...)`` form (``setup_context`` costs ~20 µs of argument
binding per call), so they do not support ``torch.func`` transforms.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
#: Convolutions with fewer multiply-adds than this keep PyTorch's own derivatives: the custom
#: path costs ~0.2 ms of Python per layer and iteration, the convolution it saves ~2·MACs flops.
LEAN_CONV_MIN_MACS = 4_000_000
_first_order_depth = 0  # > 0 while a replay computes its own first-order gradient


@contextmanager
def lean_second_order() -> Iterator[None]:
    """Route ``conv2d`` and training-mode ``batch_norm`` through the lean functions below."""
    global _first_order_depth
    _first_order_depth += 1
    try:
        with _LeanMode():
            yield
    finally:
        _first_order_depth -= 1


def _engine_needs(tensor: torch.Tensor | None) -> bool:
    """Whether the running backward pass will use a gradient for ``tensor`` (True if unsure)."""
    if tensor is None or not tensor.requires_grad:
        return False
    try:
        return bool(torch._C._will_engine_execute_node(get_gradient_edge(tensor).node))
    except (RuntimeError, AttributeError):  # a leaf that autograd.grad captures; old torch
        return True


def _needed(static: bool, tensor: torch.Tensor | None, is_parameter: bool) -> bool:
    """Static ``needs_input_grad`` narrowed by the engine where that saves work."""
    if not static or tensor is None:
        return False
    if _first_order_depth > 0:  # the replay's own ∇_θ L: parameters are its outputs
        return is_parameter or tensor.grad_fn is not None or _engine_needs(tensor)
    return _engine_needs(tensor) if is_parameter else True


def _refuse_third_order() -> None:
    if torch.is_grad_enabled():  # create_graph=True through a second derivative
        raise RuntimeError(
            "third derivatives through the replayed update are not supported: the second "
            "derivatives of conv2d/batch_norm in fedleak.harness.federated.second_order are "
            "hand-written"
        )


def _channel_shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


class _Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                conv: tuple[list[int], list[int], list[int], int]) -> torch.Tensor:
        stride, padding, dilation, groups = conv
        ctx.save_for_backward(x, w, b)
        ctx.conv = conv
        return aten.convolution(x, w, b, stride, padding, dilation, False, [0, 0], groups)

    @staticmethod
    def backward(ctx: Any, g_out: torch.Tensor) -> tuple[Any, ...]:
        x, w, b = ctx.saved_tensors
        need = ctx.needs_input_grad
        mask = (_needed(need[0], x, False), _needed(need[1], w, True), _needed(need[2], b, True))
        g_x, g_w, g_b = _Conv2dBackward.apply(g_out, x, w, ctx.conv, mask)
        return g_x, g_w, g_b, None


class _Conv2dBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                conv: tuple[list[int], list[int], list[int], int],
                mask: tuple[bool, bool, bool]) -> tuple[torch.Tensor | None, ...]:
        stride, padding, dilation, groups = conv
        ctx.save_for_backward(g_out, x, w)
        ctx.conv = conv
        bias_sizes = [w.shape[0]] if mask[2] else None
        return tuple(aten.convolution_backward(
            g_out, x, w, bias_sizes, stride, padding, dilation, False, [0, 0], groups, list(mask)
        ))

    @staticmethod
    def backward(ctx: Any, gg_x: torch.Tensor | None, gg_w: torch.Tensor | None,
                 gg_b: torch.Tensor | None) -> tuple[Any, ...]:
        _refuse_third_order()
        g_out, x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        need = ctx.needs_input_grad
        args = (stride, padding, dilation, False, [0, 0], groups)
        r_g = r_x = r_w = None
        if need[0]:
            terms = []
            if gg_x is not None:
                terms.append(aten.convolution(gg_x, w, None, *args))
            if gg_w is not None:
                terms.append(aten.convolution(x, gg_w, None, *args))
            if gg_b is not None:
                terms.append(gg_b.view(_channel_shape(g_out)).expand_as(g_out))
            r_g = sum(terms[1:], terms[0]) if terms else None
        if need[1] and gg_w is not None:
            r_x = aten.convolution_backward(
                g_out, x, gg_w, None, *args, [True, False, False]
            )[0]
        if need[2] and gg_x is not None and _needed(True, w, True):
            r_w = aten.convolution_backward(
                g_out, gg_x, w, None, *args, [False, True, False]
            )[1]
        return r_g, r_x, r_w, None, None


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                momentum: float, eps: float) -> torch.Tensor:
        y, mean, invstd = aten.native_batch_norm(
            x, w, b, running_mean, running_var, True, momentum, eps
        )
        ctx.save_for_backward(x, w, b, mean, invstd)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx: Any, g_y: torch.Tensor) -> tuple[Any, ...]:
        x, w, b, mean, invstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        mask = (_needed(need[0], x, False), _needed(need[1], w, True), _needed(need[2], b, True))
        g_x, g_w, g_b = _BatchNormBackward.apply(g_y, x, w, mean, invstd, ctx.eps, mask)
        return g_x, g_w, g_b, None, None, None, None


class _BatchNormBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g_y: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                mean: torch.Tensor, invstd: torch.Tensor, eps: float,
                mask: tuple[bool, bool, bool]) -> tuple[torch.Tensor | None, ...]:
        ctx.save_for_backward(g_y, x, w, mean, invstd)
        return tuple(aten.native_batch_norm_backward(
            g_y, x, w, None, None, mean, invstd, True, eps, list(mask)
        ))

    @staticmethod
    def backward(ctx: Any, gg_x: torch.Tensor | None, gg_w: torch.Tensor | None,
                 gg_b: torch.Tensor | None) -> tuple[Any, ...]:
        _refuse_third_order()
        g_y, x, w, mean, invstd = ctx.saved_tensors
        need_g, need_x, need_w = ctx.needs_input_grad[:3]
        need_w = need_w and _needed(True, w, True)
        shape = _channel_shape(x)
        dims = [0, *range(2, x.dim())]
        r = invstd.view(shape)
        gamma_r = w.view(shape) * r
        xhat = (x - mean.view(shape)) * r
        u = (g_y * xhat).mean(dims, keepdim=True)
        p_g = torch.addcmul(g_y - g_y.mean(dims, keepdim=True), xhat, u, value=-1)
        r_g = r_x = r_w = None
        if gg_x is not None:
            v = (gg_x * xhat).mean(dims, keepdim=True)
            p_gg = torch.addcmul(gg_x - gg_x.mean(dims, keepdim=True), xhat, v, value=-1)
            k = (gg_x * p_g).sum(dims, keepdim=True)
            if need_g:
                r_g = p_gg * gamma_r
            if need_x:
                c = -gamma_r * r
                coef_p = c * v if gg_w is None else c * v + gg_w.view(shape) * r
                r_x = torch.addcmul(xhat * (c * k / (x.numel() // x.shape[1])), p_gg, c * u)
                r_x = torch.addcmul(r_x, p_g, coef_p)
            if need_w:
                r_w = (r * k).view(-1)
        elif need_x and gg_w is not None:
            r_x = p_g * (gg_w.view(shape) * r)
        if need_g and gg_w is not None:
            r_g = xhat * gg_w.view(shape) if r_g is None else torch.addcmul(
                r_g, xhat, gg_w.view(shape))
        if need_g and gg_b is not None:
            t = gg_b.view(shape)
            r_g = t.expand_as(g_y).clone() if r_g is None else r_g + t
        return r_g, r_x, r_w, None, None, None, None


def _plain_cpu(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.layout == torch.strided and not x.is_mkldnn


def _pair(value: int | tuple[int, ...] | list[int]) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


def _conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
            ) -> torch.Tensor:
    if isinstance(padding, str) or input.dim() != 4 or weight.dim() != 4 or not _plain_cpu(input):
        return torch.conv2d(input, weight, bias, stride, padding, dilation, groups)
    conv = (_pair(stride), _pair(padding), _pair(dilation), int(groups))
    macs = input.numel() // input.shape[1] * weight.numel() // (conv[0][0] * conv[0][1])
    if macs < LEAN_CONV_MIN_MACS:
        return torch.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return _Conv2d.apply(input, weight, bias, conv)


def _batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, training: bool = False,
                momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    if not training or weight is None or bias is None or input.dim() < 2 or not _plain_cpu(input):
        return F.batch_norm(input, running_mean, running_var, weight, bias, training,
                            momentum, eps)
    return _BatchNorm.apply(input, weight, bias, running_mean, running_var, momentum, eps)


class _LeanMode(TorchFunctionMode):
    """Sends ``torch.conv2d`` / ``F.batch_norm`` to the lean functions, everything else through."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.conv2d:
            return _conv2d(*args, **kwargs)
        if func is F.batch_norm:
            return _batch_norm(*args, **kwargs)
        return func(*args, **kwargs)
