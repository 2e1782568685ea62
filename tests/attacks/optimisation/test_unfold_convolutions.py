"""Convolutions as im2col and a product: the convolution's values and first and second
derivatives, the calls left alone, and which loops take them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedleak.attacks.optimisation.engine import unfold_convolutions
from fedleak.attacks.optimisation.engine.convolutions import unfolded_convolutions
from fedleak.attacks.optimisation.engine.unfold_convolutions import (
    UnfoldConvolutions,
    unfold_conv2d,
)

CASES = [  # stride, padding, dilation, bias
    (1, 0, 1, True), (2, 2, 1, True), ((2, 1), (1, 2), 1, False), (1, 1, 2, True),
]


@pytest.mark.parametrize("stride, padding, dilation, bias", CASES)
def test_values_and_both_derivatives_are_the_convolutions(stride, padding, dilation, bias):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None

    def outputs(conv):
        y = conv(x, w, b, stride=stride, padding=padding, dilation=dilation)
        # the attack's shape of computation: a parameter gradient, then its gradient in x
        (gw,) = torch.autograd.grad(torch.sigmoid(y).square().sum(), (w,), create_graph=True)
        (gx,) = torch.autograd.grad(gw.square().sum(), (x,))
        return y, gw, gx

    for ours, theirs in zip(outputs(unfold_conv2d), outputs(F.conv2d), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def test_the_mode_unfolds_plain_convolutions_and_leaves_the_rest(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 6, 6)
    w = torch.randn(4, 4, 3, 3)
    grouped = torch.randn(4, 2, 3, 3)
    seen = []

    def counted(*args, **kwargs):
        seen.append(args[1].shape)
        return unfold_conv2d(*args, **kwargs)

    monkeypatch.setattr(unfold_convolutions, "unfold_conv2d", counted)
    with UnfoldConvolutions():
        plain = F.conv2d(x, w, padding=1)
        assert len(seen) == 1
        same = F.conv2d(x, w, padding="same")  # a string padding: the kernel
        two_groups = F.conv2d(x, grouped, groups=2)  # groups: the kernel
        module = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        module.weight.data.copy_(w)
        through_module = module(x)
    assert len(seen) == 2  # the module's call, not the string padding nor the groups
    torch.testing.assert_close(plain, F.conv2d(x, w, padding=1))
    torch.testing.assert_close(same, F.conv2d(x, w, padding="same"))
    torch.testing.assert_close(two_groups, F.conv2d(x, grouped, groups=2))
    torch.testing.assert_close(through_module, plain)


def test_a_compiled_step_of_one_small_image_unfolds_an_eager_loop_does_not():
    one = torch.zeros(1, 1, 3, 32, 32)
    assert unfolded_convolutions("auto", one, 60_000, compiled=True)
    assert not unfolded_convolutions("auto", one, 60_000, compiled=False)
    assert not unfolded_convolutions("auto", torch.zeros(1, 8, 3, 32, 32), 60_000, compiled=True)
    assert unfolded_convolutions("unfold", torch.zeros(1, 8, 3, 224, 224), 10**8, compiled=False)
    assert not unfolded_convolutions("native", one, 1, compiled=True)
    with pytest.raises(ValueError, match="convolutions must be one of"):
        unfolded_convolutions("im2col", one, 1, compiled=True)
