"""The KKT attack's graph-safe loop, recorded as a CUDA graph and replayed.

The eager loop's maths with its state on the device (:mod:`fedleak.attacks.capture`).

One step of a run (:class:`~fedleak.attacks.kkt.random_search.RunLoop`) is eq. (8) of
:mod:`fedleak.attacks.kkt.loss` at (x, λ), its gradient (a double backward), and the
optimiser's step: SGD with momentum μ = 0.9, ``b ← μ b + g``, ``p ← p − lr · b``
(:class:`~fedleak.attacks.capture.DeviceSGD`), or Adam
(:class:`~fedleak.attacks.capture.DeviceSignedAdam` unsigned), x at the run's lr and λ at
its own, their state and step counters on the device. Every ``log_every``-th step (0-based
t ≡ 0 mod ``log_every``) the device tests that L and x are finite and, when they are, copies
(x, λ) into static buffers; the host reads that test and the objective only after those
steps, and stops there when it failed. Returns what
:func:`~fedleak.attacks.kkt.random_search.iterate_eager` returns — the last state that passed,
whether a check failed — with a notice when capture fell back to eager. Off CUDA the same step runs
eagerly, which is how the CPU tests check it against the eager loop.
"""

from __future__ import annotations

import torch

from fedleak.attacks.capture import (
    DeviceSGD,
    DeviceSignedAdam,
    capturable,
    constant_schedule,
    run_iterations,
)
from fedleak.attacks.kkt.random_search import SGD_MOMENTUM, RunLoop


def iterate_graph_safe(loop: RunLoop, x: torch.Tensor, lambdas: torch.Tensor
                       ) -> tuple[tuple[torch.Tensor, torch.Tensor], bool, str | None]:
    """Run :func:`~fedleak.attacks.kkt.random_search.iterate_eager`'s maths as a graph-safe step.

    Captured as a CUDA graph on CUDA, eager elsewhere (module docstring).
    """
    cfg, settings = loop.config, loop.settings
    dev, dtype = x.device, x.dtype
    lambda_lr = loop.lambda_lr
    optimisers: list[DeviceSignedAdam | DeviceSGD]
    if cfg.optimizer == "adam":
        optimisers = [
            DeviceSignedAdam(x, constant_schedule(settings.lr), signed=False),
            DeviceSignedAdam(lambdas, constant_schedule(lambda_lr),
                             signed=False)]
    else:
        optimisers = [
            DeviceSGD(x, constant_schedule(settings.lr), SGD_MOMENTUM),
            DeviceSGD(lambdas, constant_schedule(lambda_lr), SGD_MOMENTUM)]
    t = torch.zeros((), dtype=torch.int64, device=dev)
    passed = torch.ones((), dtype=torch.bool, device=dev)
    value = torch.zeros((), dtype=dtype, device=dev)
    last = (x.detach().clone(), lambdas.detach().clone())

    def step() -> None:
        terms = loop.objective(x, lambdas)
        grads = torch.autograd.grad(terms.total, [x, lambdas])
        with torch.no_grad():
            check = t.remainder(cfg.log_every) == 0
            finite = torch.isfinite(terms.total) & torch.isfinite(x).all()
            passed.copy_(finite | ~check)
            keep = check & finite
            last[0].copy_(torch.where(keep, x, last[0]))
            last[1].copy_(torch.where(keep, lambdas, last[1]))
            value.copy_(terms.total)
            for optimiser, grad in zip(optimisers, grads, strict=True):
                optimiser.step(grad)
            t.add_(1)

    diverged = False

    def on_step(done: int) -> bool:
        nonlocal diverged
        if (done - 1) % cfg.log_every != 0:
            return False
        if not bool(passed):
            diverged = True
            return True
        if loop.progress is not None:
            loop.progress(loop.offset + done, loop.total, float(value))
        return False

    notice = run_iterations(step, cfg.iterations, dev, capture=capturable(dev),
                            on_step=on_step)
    return last, diverged, notice
