"""Captured iterations: one optimisation step recorded as a CUDA graph, then replayed.

On a GPU one attack iteration — the replayed update (a forward and a double backward of the
model), the cosine objective, one vector–Jacobian product, signed Adam, the box projection and
the step-size schedule — is hundreds of small kernels, and the GPU waits for Python between
them. ``torch.cuda.graph`` records the kernels of one iteration once and replays them with one
launch. That needs a *graph-safe* step: every tensor it reads or writes keeps its address
(static buffers: the images, Adam's moments, the objective), and nothing in it depends on a
Python number that changes between iterations or reads the device back to the host. So:

- the step size is read on the device from a precomputed schedule, ``lr_t = schedule[t]``
  (the ⌊3T/8⌋, ⌊5T/8⌋, ⌊7T/8⌋ decay of
  :func:`~fedleak.attacks.optimisation.presets.inverting_gradients.step_size`);
- Adam's step counter t is a device tensor, and its bias corrections 1 − β₁ᵗ, 1 − β₂ᵗ are
  computed on the device (:class:`DeviceSignedAdam`, the same maths as
  :class:`~fedleak.attacks.optimisation.presets.inverting_gradients.SignedAdam`);
- the objective is copied into a static buffer that the caller reads only every ``log_every``
  replays (the loop's one host synchronisation).

:func:`run_iterations` warms the step up on a side stream (cuDNN and cuBLAS pick their kernels,
the caching allocator settles), captures one step and replays it; where capture is impossible
(not CUDA, or an operation that cannot be captured) it runs the very same graph-safe step
eagerly and says why. The eager CPU path of the attacks does not use this module: on two CPU
cores Python is not the bottleneck.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def scheduled_rate(schedule: torch.Tensor, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return ``schedule[t − 1]`` read on the device, shaped to scale ``like``.

    Past its end the schedule's last entry holds (a one-entry schedule is a constant rate).

    A schedule ``[T]`` gives one rate (0-dim); a schedule ``[T, K]`` gives one rate per leading
    slice of ``like`` (K packed runs), shaped ``[K, 1, …, 1]``.
    """
    step = (t - 1).clamp(max=schedule.shape[0] - 1).view(1)
    rate = schedule.index_select(0, step).squeeze(0)
    if rate.dim() == 1:
        rate = rate.view(-1, *[1] * (like.dim() - 1))
    return rate


class DeviceSignedAdam:
    """Signed Adam whose whole state lives on the images' device (graph-safe).

    ``m ← β₁m + (1−β₁)s``, ``v ← β₂v + (1−β₂)s²``, ``x ← x − lr_t/(1−β₁ᵗ) · m/(√v/√(1−β₂ᵗ) + ε)``
    with ``s = sign(∇)`` and ``lr_t = schedule[t − 1]``: the step counter and the bias
    corrections are computed in float64 on the device, as ``SignedAdam`` does in Python. A
    schedule ``[T, K]`` steps K packed runs at their own rates (:func:`scheduled_rate`).
    """

    def __init__(self, images: torch.Tensor, schedule: torch.Tensor, signed: bool = True) -> None:
        self.images = images
        self.signed = signed
        self.m = torch.zeros_like(images)
        self.v = torch.zeros_like(images)
        device = images.device
        self.t = torch.zeros((), dtype=torch.int64, device=device)
        self.schedule = schedule.to(device=device, dtype=torch.float64)
        self._betas = torch.tensor(ADAM_BETAS, dtype=torch.float64, device=device)

    def step(self, grad: torch.Tensor) -> None:
        """One update of ``images`` in place; ``grad`` is overwritten."""
        beta1, beta2 = ADAM_BETAS
        self.t += 1
        s = grad.sign_() if self.signed else grad
        self.m.lerp_(s, 1 - beta1)
        self.v.mul_(beta2).addcmul_(s, s, value=1 - beta2)
        corrections = 1 - self._betas.pow(self.t)  # [1 − β₁ᵗ, 1 − β₂ᵗ], float64
        lr = scheduled_rate(self.schedule, self.t, self.images)
        factor = (lr / corrections[0]).to(self.images.dtype)
        denom = (self.v.sqrt() / corrections[1].sqrt().to(self.v.dtype)).add_(ADAM_EPS)
        self.images.sub_(self.m / denom * factor)


class DeviceSGD:
    """SGD with heavy-ball momentum whose state lives on the parameter's device (graph-safe).

    ``b ← μ b + g`` (``b₁ = g``), ``p ← p − lr_t · b`` with ``lr_t = schedule[t − 1]``: the
    update of ``torch.optim.SGD(momentum=μ, dampening=0)``; ``μ = 0`` is plain descent. A
    schedule ``[T, K]`` steps K packed runs at their own rates (:func:`scheduled_rate`).
    """

    def __init__(self, parameter: torch.Tensor, schedule: torch.Tensor,
                 momentum: float = 0.0) -> None:
        self.parameter = parameter
        self.momentum = momentum
        self.buffer = torch.zeros_like(parameter)
        self.t = torch.zeros((), dtype=torch.int64, device=parameter.device)
        self.schedule = schedule.to(device=parameter.device, dtype=torch.float64)

    def step(self, grad: torch.Tensor) -> None:
        """One update of ``parameter`` in place."""
        self.t += 1
        self.buffer.mul_(self.momentum).add_(grad)
        lr = scheduled_rate(self.schedule, self.t, self.parameter)
        self.parameter.sub_(self.buffer * lr.to(self.parameter.dtype))


def constant_schedule(lr: float) -> torch.Tensor:
    """Return the schedule of a constant rate ``lr`` (one float64 entry, on the CPU)."""
    return torch.tensor([float(lr)], dtype=torch.float64)


def capturable(device: torch.device) -> bool:
    """Whether steps on ``device`` can be captured as CUDA graphs."""
    return device.type == "cuda" and torch.cuda.is_available()


def run_iterations(
    step: Callable[[], None],
    iterations: int,
    device: torch.device,
    *,
    capture: bool = True,
    warmup: int = 3,
    on_step: Callable[[int], bool | None] | None = None,
) -> str | None:
    """Run the graph-safe ``step`` ``iterations`` times, captured on CUDA when ``capture``.

    ``on_step(done)`` is called after every iteration; it should read the device only now and
    then (every ``log_every`` steps), since each read waits for the GPU. When it returns True
    the loop stops there (a diverged run). Returns None, or a one-line notice when capture was
    asked for but the step ran eagerly.
    """
    notice = None
    done = 0
    stopped = False

    def advance(count: int) -> None:
        nonlocal done, stopped
        for _ in range(count):
            if stopped:
                return
            step()
            done += 1
            if on_step is not None and on_step(done):
                stopped = True

    if not capture or not capturable(device) or iterations <= warmup + 1:
        advance(iterations)
        return None if not capture or not capturable(device) else \
            "too few iterations to capture; ran eagerly"
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        advance(warmup)
    torch.cuda.current_stream(device).wait_stream(side)
    if stopped:
        return None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as err:  # an operation that cannot be captured
        notice = f"CUDA graph capture failed ({str(err).splitlines()[0][:120]}); ran eagerly"
        torch.cuda.synchronize(device)
        advance(iterations - done)
        return notice
    while done < iterations:
        graph.replay()
        done += 1
        if on_step is not None and on_step(done):
            break
    return notice


def captured_function(
    function: Callable[[], None], device: torch.device, *, warmup: int = 3
) -> tuple[Callable[[], None], str | None]:
    """Record ``function`` once as a CUDA graph; return (a replay of it, notice).

    For an evaluation whose inputs and outputs live in static buffers and that has no side
    effect besides writing those outputs (DLG's objective and gradient at the current images),
    so the ``warmup`` eager calls on a side stream change nothing. Off CUDA, or when capture
    fails, the function itself is returned with a one-line notice saying why (None off CUDA).
    """
    if not capturable(device):
        return function, None
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            function()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            function()
    except RuntimeError as err:  # an operation that cannot be captured
        torch.cuda.synchronize(device)
        return function, f"CUDA graph capture failed ({str(err).splitlines()[0][:120]}); " \
            "ran eagerly"
    return graph.replay, None
