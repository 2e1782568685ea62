"""A compiled step saved whole, loaded by a later process without tracing (AOT precompile).

On the JIT route (:func:`torch.compile`) every process traces the step with Dynamo again before
Inductor's caches can hand back the compiled code: for LeNet on one image about 1.5 s of
bytecode tracing and 0.6 s of cache lookups, each run. Here the first process traces once with
``torch.compile(step, fullgraph=True).aot_compile(...)`` (Dynamo's *precompile*) and saves the
whole compiled function — the transformed bytecode, the guards and Inductor's code, bundled —
as one file under the step's key
(:mod:`~fedleak.attacks.optimisation.engine.step_fingerprint`) in fedleak's compile cache; a
later process with the same key loads that file (no tracing, no code generation) and runs it.

The file holds no model and no data. What the step reads lives in its closure — the problem
(its replay with the model's parameters, the observed update u*, the labels) and the prior
terms — and is passed *at load* as external data: the loaded code reads this process's problem,
so one file serves every round, weight and target of the same structure. Its guards are those
Dynamo can save (types, tensor shapes, dtypes and strides, constants; not object identities,
functions or dict versions, which the key stands in for), checked on the first call; a step
that fails them, a file that does not load, or a loaded step whose first call fails (the file
is removed) is traced as usual, with no notice (it is a cache). After that first call the loop
calls the step without guard checks, as the JIT route does under ``skip_guard_eval_unsafe``. A
key whose step failed to compile on both routes is remembered as ``<key>.failed`` (its error),
and later processes skip it (the next Inductor wrapper, or eager, with the notice).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

#: Dynamo's guard kinds that cannot be saved (:class:`torch._dynamo.guards.CheckFunctionManager`)
UNSAVED_GUARDS = ("DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH",
                  "MODULE_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE")


def saved_step_path(cache_dir: Path, key: str) -> Path:
    """Where the step with ``key`` is saved in the compile cache ``cache_dir``."""
    return cache_dir / "steps" / f"{key}.bin"


def failed_step_path(cache_dir: Path, key: str) -> Path:
    """Where a step with ``key`` that did not compile is remembered (its error, one line)."""
    return cache_dir / "steps" / f"{key}.failed"


class CompileFailedBefore(RuntimeError):
    """The step (its key, its Inductor options) failed to compile in an earlier process."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed before on this machine: {reason} (remove "
                         "the .failed file under the compile cache's steps/ to try again)")


def remember_failure(path: Path, error: BaseException) -> None:
    """Write ``error``'s first line to ``path``; a failure to write is no error."""
    text = str(error).strip()
    reason = f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason + "\n")


def saved_guards(entries: Sequence[Any]) -> list[bool]:
    """Dynamo's ``guard_filter_fn``: keep the guards that can be saved (not globals' either)."""
    unsaved = set(UNSAVED_GUARDS)
    return [not (entry.is_global or entry.guard_type in unsaved
                 or unsaved.intersection(entry.derived_guard_types or ()))
            for entry in entries]


def precompile(step: Callable[..., Any], example: tuple[Any, ...], options: dict[str, Any],
               context: Callable[[], contextlib.AbstractContextManager[Any]]) -> Any:
    """Trace and compile ``step`` once at ``example`` inputs under ``context()``.

    Raises where Dynamo or Inductor cannot (a graph break counts: the step is one graph).
    """
    compiled = torch.compile(step, fullgraph=True, dynamic=False,
                             options={**options, "guard_filter_fn": saved_guards})
    with context():
        return compiled.aot_compile((example, {}))  # type: ignore[attr-defined]


def save_step(function: Any, path: Path, closure: dict[str, Any]) -> None:
    """Save a precompiled ``function`` at ``path``, leaving the objects of ``closure`` out.

    They are the caller's at load. Written to a temporary file and renamed: a concurrent
    reader sees the whole file or none.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    function.save_compiled_function(str(path), external_data=closure)


def load_step(path: Path, closure: dict[str, Any]) -> Any | None:
    """Load the precompiled function saved at ``path``, reading ``closure``.

    None where there is no such file or this torch cannot load it (the file is removed).
    """
    if not path.is_file():
        return None
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import get_metrics_context
    from torch._guards import CompileContext, TracingContext, compile_context, tracing

    try:
        # unpickling Dynamo's sources installs guards: it needs a compile and a tracing context
        with open(path, "rb") as file, \
                compile_context(CompileContext(convert_frame.get_compile_id({}))), \
                get_metrics_context(), tracing(TracingContext(None)):
            return torch.compiler.load_compiled_function(file, external_data=closure)
    except Exception:  # noqa: BLE001 - a stale or foreign file is a cache miss
        with contextlib.suppress(OSError):
            os.remove(path)
        return None
