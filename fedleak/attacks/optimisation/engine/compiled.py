"""The compiled objective step: F's value and ∇F of eq. (1) as one ``torch.compile`` graph.

The eager loop (:mod:`~fedleak.attacks.optimisation.engine.eager`) spends one Python call and one
ATen dispatch per tensor operation: ~800 of them per iteration of a LeNet on one 32×32 image,
whose arithmetic (~11 MFLOP) one core does in well under a millisecond. Here the same gradient,

    ∇_X F = s ⊙ (∂u/∂X)ᵀ g + Σ_k (λ_k / s) ⊙ s ⊙ ∇R_k(X),

(J's value, cotangent g and scale s from the objective part; the priors' terms R_k per restart)
is written with ``torch.func.vjp`` over the *functional* replay of R restarts
(:data:`~fedleak.attacks.replay_contract.RestartsUpdateFn`, ``torch.func.vmap`` over
``torch.func.grad``), and that function is compiled by TorchInductor: the forward, the user's
first backward and the attack's second backward become one graph of fused C++ loops around the
convolutions and GEMMs. The weights λ_k(i) enter as a tensor, so a scheduled weight does not
recompile. The numbers are the eager engine's up to float rounding (fusion reorders sums;
``tests/attacks/optimisation/test_compiled.py`` holds them to a tolerance).

The compilation (~10–25 s of CPU for a small model) is paid once per machine and problem
structure: the compiled step is saved whole under a key of what it reads
(:mod:`~fedleak.attacks.optimisation.engine.precompiled`,
:mod:`~fedleak.attacks.optimisation.engine.step_fingerprint`) in :func:`compile_cache_dir`
(fedleak's cache folder, ``$FEDLEAK_CACHE`` — ``$FEDLEAK_CACHE_DIR``, its older name, is still
read — else ``$XDG_CACHE_HOME/fedleak`` or ``~/.cache/fedleak``, sub-folder ``inductor``), beside
Inductor's FX graph cache and AOTAutograd's cache; a later process with the same key loads it
without tracing (a LeNet on one image: about 1.4 s of CPU more than an eager run, most of it
importing Dynamo and Inductor), whatever the model's weights, the target and the labels. Where
the step cannot be saved (a graph break, a problem that revises its replay), the JIT route of
``torch.compile`` retraces with Dynamo in every process and loads from those caches. Inductor's
vector-ISA probe is remembered too (:mod:`~fedleak.attacks.optimisation.engine.vector_isa`).

The step is called under ``torch.no_grad()``: the model's parameters require a gradient, and
outside ``no_grad`` AOTAutograd would build a *training* graph (a joint forward–backward,
partitioned, for a backward nobody calls), which its cache only saves once that backward is
compiled — never, so every run traced and partitioned the joint graph again. Under ``no_grad``
the graph is an inference graph, saved at once and loaded on later runs (``torch.func.vjp`` and
``grad`` inside it are transforms: they ignore the outer ``no_grad``, so ∇F is the same). Where
compilation fails (an operation Dynamo or Inductor cannot handle, no C++ compiler),
:func:`compiled_gradient` returns the eager gradient with a one-line notice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Any

import torch

from fedleak.attacks.optimisation.engine.eager import optimise_eager
from fedleak.attacks.optimisation.engine.precompiled import (
    CompileFailedBefore,
    failed_step_path,
    load_step,
    precompile,
    remember_failure,
    save_step,
    saved_step_path,
)
from fedleak.attacks.optimisation.engine.problem import (
    GradientFn,
    InversionProblem,
    ProgressSpan,
    Weight,
)
from fedleak.attacks.optimisation.engine.step_fingerprint import step_fingerprint
from fedleak.attacks.optimisation.engine.unfold_convolutions import UnfoldConvolutions
from fedleak.attacks.optimisation.engine.vector_isa import trust_probed_isa
from fedleak.attacks.optimisation.priors import BoundPrior

#: ``torch.compile``'s ``options``: Inductor settings by name
InductorOptions = dict[str, str | int | bool | Callable[..., Any]]


def compile_cache_dir() -> Path:
    """Where the compiled code is kept between processes (module docstring)."""
    root = os.environ.get("FEDLEAK_CACHE") or os.environ.get("FEDLEAK_CACHE_DIR")
    if root:
        return Path(root) / "inductor"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedleak" / "inductor"


def use_compile_cache() -> None:
    """Keep Inductor's compiled code between processes.

    Points Inductor's caches at :func:`compile_cache_dir` (unless the user set
    ``TORCHINDUCTOR_CACHE_DIR``) and turns the persistent FX-graph and AOTAutograd caches on.
    Importing ``torch._dynamo`` writes torch's own default (``/tmp/torchinductor_<user>``) into
    ``TORCHINDUCTOR_CACHE_DIR``, so that value counts as not set: a process that imported
    Dynamo before its first compile (a test module, a plug-in) still uses fedleak's folder.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    trust_probed_isa(compile_cache_dir())


def traced_gradient(problem: InversionProblem, terms: Sequence[BoundPrior]
                    ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Write ``(X, λ) → (∇F, F)`` of a ``rows`` problem with ``torch.func.vjp``.

    This is the function that is compiled; run eagerly, it is the eager engine's maths.
    """
    if not problem.rows:
        raise ValueError("the compiled step needs the restart form of the problem (rows)")

    def gradient(images: torch.Tensor, weights: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        def outputs(x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            return list(problem.replay(x, problem.labels)), [b.rows(x) for b in terms]

        pulled = torch.func.vjp(outputs, images)
        (update, priors), pullback = pulled[0], pulled[1]
        value, output_grads, scale = problem.objective.value_and_output_grads(update)
        prior_grads = []
        for k, term in enumerate(priors):
            value = value + term.detach() * weights[k]
            prior_grads.append(weights[k] / scale)
        (grad,) = pullback((list(output_grads), prior_grads))
        return grad * scale.view(-1, *[1] * (images.dim() - 1)), value

    return gradient


def compiled_gradient(problem: InversionProblem, terms: Sequence[BoundPrior],
                      images: torch.Tensor, weights: Sequence[Weight], *, unfold: bool = False
                      ) -> tuple[GradientFn, str | None]:
    """Compile ``(X, λ) → (∇F, F)`` of :func:`traced_gradient`, or fall back to eager.

    The compiled function is run once on ``images`` at ``weights`` (the first iteration's).
    On a CPU Inductor writes its wrapper — the code that calls the kernels — in C++
    (``cpp_wrapper``: no Python call per kernel; LeNet on one image 0.84 → 0.75 ms an
    iteration); where that does not compile, the Python wrapper is tried. ``unfold`` runs the
    2-D convolutions as im2col and a product
    (:mod:`~fedleak.attacks.optimisation.engine.unfold_convolutions`). When compiling fails,
    the eager
    :meth:`~fedleak.attacks.optimisation.engine.problem.InversionProblem.value_and_gradient`
    comes back instead, with a one-line notice saying why.
    """
    use_compile_cache()
    wrappers: list[InductorOptions] = [{"cpp_wrapper": True}, {}] if images.device.type == "cpu" \
        else [{}]
    failure: Exception | None = None
    for options in wrappers:
        try:
            return _compiled_step(problem, terms, images, weights, options, unfold), None
        except Exception as err:  # noqa: BLE001 - any compiler failure: the next form
            failure = err
    assert failure is not None
    reason = str(failure).strip().splitlines()[0][:200] if str(failure).strip() else \
        type(failure).__name__
    return (lambda x, values: problem.value_and_gradient(x, terms, values),
            f"compile failed ({type(failure).__name__}: {reason}); the step ran eagerly")


def _compiled_step(problem: InversionProblem, terms: Sequence[BoundPrior], images: torch.Tensor,
                   weights: Sequence[Weight],
                   options: InductorOptions, unfold: bool
                   ) -> GradientFn:
    """Compile the step with Inductor ``options`` and run it once (raises where it cannot).

    A step saved by an earlier process under the same key is loaded instead of traced; a new
    one is precompiled and saved (:mod:`~fedleak.attacks.optimisation.engine.precompiled`);
    where that cannot be (a graph break, an unreadable problem, a problem that revises its
    replay), the JIT route of ``torch.compile``. A key whose step failed to compile on both
    routes is remembered, and a later process raises at once
    (:class:`~fedleak.attacks.optimisation.engine.precompiled.CompileFailedBefore`) instead of
    compiling it again.
    """
    dtype, device = images.dtype, images.device
    last: list[Any] = [None, None]  # λ's last values and their tensor: most steps reuse it

    def as_tensor(values: Sequence[Weight]) -> torch.Tensor:
        numbers = all(isinstance(w, (int, float)) for w in values)
        if numbers and last[0] == tuple(values):
            return last[1]  # type: ignore[no-any-return]
        weights = torch.zeros(0, dtype=dtype, device=device) if not values else \
            torch.stack([torch.as_tensor(w, dtype=dtype, device=device) for w in values])
        last[:] = [tuple(values) if numbers else None, weights]
        return weights

    def context() -> ExitStack:
        # no_grad: an inference graph, which AOTAutograd's cache keeps (module docstring);
        # the unfolding mode: the compiled code reads the mode stack it was traced under
        stack = ExitStack()
        stack.enter_context(torch.no_grad())
        if unfold:
            stack.enter_context(UnfoldConvolutions())
        return stack

    gradient = traced_gradient(problem, terms)
    example = (images.detach(), as_tensor(weights))
    # the key of what the traced step reads (traced_gradient): not the loop's settings (T, the
    # optimiser); none for a problem that revises its replay (its guards must stay)
    key = None if problem.revise is not None else step_fingerprint(
        [problem.replay, problem.labels, problem.objective, terms, example],
        {**options, "unfold": unfold})
    failed = failed_step_path(compile_cache_dir(), key) if key is not None else None
    if failed is not None and failed.is_file():
        raise CompileFailedBefore(failed.read_text(errors="replace").strip()[:200])
    saved = None if key is None else _saved_step(gradient, problem, terms, example, key,
                                                 options, context)
    routes = ([saved] if saved is not None else []) + [None]  # None: the JIT route
    for run in routes:
        jit = run is None
        compiled: Any = torch.compile(gradient, dynamic=False, options=options or None) \
            if jit else run

        def step(x: torch.Tensor, values: Sequence[Weight], compiled: Any = compiled
                 ) -> tuple[torch.Tensor, torch.Tensor]:
            with context():
                grad, value = compiled(x.detach(), as_tensor(values))
            return grad, value

        try:
            step(images, weights)
        except Exception as err:
            if not jit:  # a saved step that does not run: a cache miss, the JIT route next
                with contextlib.suppress(OSError):
                    saved_step_path(compile_cache_dir(), str(key)).unlink()
                continue
            if failed is not None:  # remembered: later processes do not compile it again
                remember_failure(failed, err)
            raise
        if not jit:
            compiled.disable_guard_check()  # checked on that first call; nothing they see
        return step  # changes in the loop
    raise AssertionError("unreachable: the JIT route returns or raises")


def _saved_step(gradient: Callable[..., Any], problem: InversionProblem,
                terms: Sequence[BoundPrior], example: tuple[torch.Tensor, torch.Tensor],
                key: str, options: InductorOptions,
                context: Callable[[], ExitStack]) -> Any | None:
    """Load the precompiled step saved under its key, or precompile and save it.

    Loaded where the file exists and its guards pass; None where the step cannot be
    precompiled (the JIT route then).
    """
    path = saved_step_path(compile_cache_dir(), key)
    closure = {"problem": problem, "terms": terms}
    loaded = load_step(path, closure)
    if loaded is not None:
        with context():
            if loaded.guard_check(*example):
                return loaded
    try:
        fresh = precompile(gradient, example, dict(options), context)
    except Exception:  # noqa: BLE001 - a graph break, or a step Dynamo cannot save: JIT
        return None
    with contextlib.suppress(Exception):
        save_step(fresh, path, closure)
    return fresh


def optimise_compiled(problem: InversionProblem, images: torch.Tensor, span: ProgressSpan,
                      *, unfold: bool = False) -> tuple[str | None, torch.Tensor]:
    """Run the eager loop with the compiled step on ``images`` ``[R, n, C, H, W]``.

    Returns the fallback notice (None when it compiled) and the result per restart, as
    :func:`~fedleak.attacks.optimisation.engine.eager.optimise_eager`; ``unfold`` as in
    :func:`compiled_gradient`.
    """
    terms = problem.terms()
    gradient, notice = compiled_gradient(
        problem, terms, images, [b.weight(0, problem.iterations) for b in terms], unfold=unfold)
    with _guards_checked_once(notice is None and problem.revise is None):
        return notice, optimise_eager(problem, images, span, gradient)


def _guards_checked_once(skip: bool) -> AbstractContextManager[object]:
    """Skip Dynamo's guard checks in the loop after the first, compiling call (``skip``).

    Each call of a compiled function first checks its guards (for LeNet on one image about 40
    Python checks on the model's module dictionaries, 84 µs a call of a 0.76 ms iteration). In
    the loop nothing they guard changes: the same problem, the same shapes, the same grad mode
    and mode stack, every iteration; so after the first call compiled, the rest run under
    ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, which checks only what tells
    cache entries apart (0.75 → 0.65 ms, the same iterates). Not where the problem revises its
    replay during the loop (a modelled visiting order), which a guard must see.
    """
    if not skip:
        return nullcontext()
    try:
        stance: AbstractContextManager[object] = torch.compiler.set_stance(
            "default", skip_guard_eval_unsafe=True)
        return stance
    except TypeError:  # a torch without the flag: every guard checked, as before
        return nullcontext()
