"""Which convolution kernels the attack's iteration runs on a CPU, chosen by the shape of the work.

One iteration of a gradient-matching attack runs every convolution of the model three times
(forward, the user's backward, the attack's double backward). PyTorch's CPU build has two
families of kernels for them: oneDNN's (``torch.backends.mkldnn``, the default) and ATen's own
(im2col + GEMM, ``slow_conv2d`` and friends). oneDNN pays a fixed cost per call (primitive
creation, layout reorders) that dominates on tiny shapes; ATen's pays nothing of the kind but
multiplies less efficiently. Measured on the engine (``bench/engine_speed.py``, one thread, an
AMD EPYC, CPU time per iteration): LeNet of DLG on one 32×32 image 3.4–3.7 ms native against
5.2 ms oneDNN; on 8 images or 8 restarts oneDNN is as fast or faster, and on ResNet20-4 it wins
by 1.3× (166 against 216 ms).

The rule (``convolutions=auto``): ATen's kernels when one restart's candidate batch holds at
most :data:`NATIVE_MAX_VALUES` values (one 3×32×32 image) and the update at most
:data:`NATIVE_MAX_COORDINATES` coordinates (a small model), else oneDNN. It depends on the
restart's batch, not on R, so restarts run vectorised and one by one use the same kernels.
Either family computes the same convolution; the sums are ordered differently (float rounding).

The compiled step (``compile``) has a third form, ``unfold``: im2col and a matrix product
written as tensor operations (:mod:`~fedleak.attacks.optimisation.engine.unfold_convolutions`),
which Inductor fuses instead of calling a kernel per convolution and derivative. Under
``auto`` a compiled step takes it where ATen's kernels would be taken (the same rule); an
eager loop never does (there it is one more operation per convolution, not fewer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

CHOICES = ("auto", "onednn", "native", "unfold")
#: the most values of one restart's batch that ATen's kernels take under ``auto``
NATIVE_MAX_VALUES = 3 * 32 * 32
#: the most update coordinates (model parameters) that ATen's kernels take under ``auto``
NATIVE_MAX_COORDINATES = 1_000_000


def native_kernels(choice: str, images: torch.Tensor, coordinates: int) -> bool:
    """Say whether the loop on ``images`` ``[R, n, C, H, W]`` runs ATen's own convolutions.

    ``native``, or ``auto`` on a small batch of a small model (an observed update of
    ``coordinates`` values; module docstring).
    """
    if choice not in CHOICES:
        raise ValueError(f"convolutions must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "auto":
        return choice == "native"
    return _small(images, coordinates)


def unfolded_convolutions(choice: str, images: torch.Tensor, coordinates: int, *,
                          compiled: bool) -> bool:
    """Say whether the loop's 2-D convolutions run as im2col and a product (``unfold``).

    ``unfold``; or ``auto`` in a compiled step where :func:`native_kernels` would take ATen's
    kernels (module docstring).
    """
    if choice not in CHOICES:
        raise ValueError(f"convolutions must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "auto":
        return choice == "unfold"
    return compiled and _small(images, coordinates)


def _small(images: torch.Tensor, coordinates: int) -> bool:
    """Say whether the work is small: on a CPU, one restart's batch ≤ one 3×32×32 image.

    And the model at most 10⁶ coordinates.
    """
    if images.device.type != "cpu":
        return False
    per_restart = images[0].numel()
    return per_restart <= NATIVE_MAX_VALUES and coordinates <= NATIVE_MAX_COORDINATES


@contextmanager
def convolution_kernels(native: bool) -> Iterator[None]:
    """Run the block with ATen's own convolutions (``native``) or leave oneDNN as it is."""
    if not native:
        yield
        return
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)  # (mkldnn.flags() would also reset oneDNN's TF32)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)
