"""Which first-order loop runs an inversion, and on which convolution kernels.

For R restarts side by side (``[R, n, C, H, W]``), one of three loops solves eq. (1):

- captured (:mod:`~fedleak.attacks.optimisation.engine.captured`): on CUDA with ``capture``;
- compiled (:mod:`~fedleak.attacks.optimisation.engine.compiled`): with ``compile`` and the
  restart form of the problem (a functional replay);
- eager (:mod:`~fedleak.attacks.optimisation.engine.eager`) otherwise;

each inside the convolution kernels chosen for the shape
(:mod:`~fedleak.attacks.optimisation.engine.convolutions`; the compiled step of one small image
writes its convolutions as im2col and a product,
:mod:`~fedleak.attacks.optimisation.engine.unfold_convolutions`) and, for one small image, on one
intra-op thread (:mod:`~fedleak.attacks.optimisation.engine.intra_op_threads`). They take the
same steps up to float rounding.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from fedleak.attacks.optimisation.engine.captured import optimise_captured
from fedleak.attacks.optimisation.engine.compiled import optimise_compiled
from fedleak.attacks.optimisation.engine.convolutions import (
    convolution_kernels,
    native_kernels,
    unfolded_convolutions,
)
from fedleak.attacks.optimisation.engine.eager import optimise_eager
from fedleak.attacks.optimisation.engine.intra_op_threads import intra_op_threads, single_thread
from fedleak.attacks.optimisation.engine.problem import InversionProblem, ProgressSpan
from fedleak.attacks.optimisation.engine.unfold_convolutions import UnfoldConvolutions


def optimise_first_order(problem: InversionProblem, images: torch.Tensor, span: ProgressSpan,
                         *, graph_safe: bool, compiled: bool, kernels: str
                         ) -> tuple[str | None, torch.Tensor]:
    """Run the loop the module docstring picks on ``images`` in place.

    Returns a notice when CUDA capture or compilation fell back to eager, and the result per
    restart (the last iterate, or the last with a finite objective when that one is not
    finite). ``kernels`` is the ``convolutions`` option (auto, onednn, native, unfold).
    """
    compiling = compiled and problem.rows and not graph_safe
    unfold = unfolded_convolutions(kernels, images, problem.coordinates,
                                   compiled=bool(compiling))
    with convolution_kernels(native_kernels(kernels, images, problem.coordinates)), \
            intra_op_threads(single_thread(images, problem.coordinates)):
        if graph_safe:
            with UnfoldConvolutions() if unfold else nullcontext():
                return optimise_captured(problem, images, span)
        if compiling:
            return optimise_compiled(problem, images, span, unfold=unfold)
        with UnfoldConvolutions() if unfold else nullcontext():
            return None, optimise_eager(problem, images, span)
