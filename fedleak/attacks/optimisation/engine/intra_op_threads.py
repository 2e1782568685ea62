"""One intra-op thread for an iteration too small to share between cores.

One iteration of a gradient-matching attack on one 3×32×32 image of a small model is ~800 ATen
calls of a few microseconds each (LeNet of DLG: ~11 MFLOP in all). With T intra-op threads
every parallel region ends at a barrier: the threads wait for one another ~800 times per
iteration, and when the machine's other cores are busy (a victim beside the attacker, other
jobs) a waiting thread waits for a time slice. Measured (2026-12-04, the project's 2-core
machine at load average 5–7, lenet-zhu, one random 32×32 image, 300 iterations of
``inverting-gradients``): 3.3 ms of CPU and 9.3 ms of wall time per iteration with one thread,
133 ms and 269 ms with two; ``fedleak demo`` (4,800 iterations) 16 s with
``OMP_NUM_THREADS=1`` against 244 s with the default two, the same reconstruction (28.31 dB).

The rule: on a CPU, when the whole candidate batch (all restarts) holds at most
:data:`~fedleak.attacks.optimisation.engine.convolutions.NATIVE_MAX_VALUES` values (one
3×32×32 image) and the update at most
:data:`~fedleak.attacks.optimisation.engine.convolutions.NATIVE_MAX_COORDINATES` coordinates,
the loop runs with one intra-op thread, restored afterwards; otherwise the threads are left as
they are. Larger batches were not measured here and keep the caller's threads. The kernels
compute each output on one thread either way; a reduction split across threads sums in
another order, so the iterates can differ by float rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedleak.attacks.optimisation.engine.convolutions import (
    NATIVE_MAX_COORDINATES,
    NATIVE_MAX_VALUES,
)


def single_thread(images: torch.Tensor, coordinates: int) -> bool:
    """Say whether the loop on ``images`` ``[R, n, C, H, W]`` runs on one intra-op thread.

    On a CPU, for a candidate batch of at most one 3×32×32 image in all and an observed update
    of at most ``coordinates`` ≤ 10⁶ values (module docstring); ``coordinates`` 0 (not known)
    counts as small.
    """
    return (images.device.type == "cpu" and images.numel() <= NATIVE_MAX_VALUES
            and coordinates <= NATIVE_MAX_COORDINATES)


@contextmanager
def intra_op_threads(one: bool) -> Iterator[None]:
    """Run the block on one intra-op thread (``one``), restoring the caller's count after."""
    before = torch.get_num_threads()
    if not one or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
