"""What decides a compiled step's graph, as one digest: the key of a saved step.

A compiled objective step (:mod:`~fedleak.attacks.optimisation.engine.compiled`) is a graph
traced from ``(X, λ) → (∇F, F)`` with the problem and the prior terms in its closure. Dynamo
reads every tensor it meets there as a graph *input* (the model's parameters, the observed
update u*, the labels ŷ, the box), so their values never enter the graph; everything else it
meets can: Python numbers and strings are constants of the graph, functions are inlined by
their code, objects are read by their type and attributes, tensors by shape, dtype, stride and
device. :func:`step_fingerprint` hashes exactly that, by walking everything reachable from the
problem and the terms,

    key = SHA-256(torch, Python, machine, fedleak's source, intra-op threads, the options,
                  walk(problem, terms, X's and λ's layout)),

where ``walk`` records each object's type; numbers, strings and enums by value; tensors and
arrays by layout (not values); containers, dataclasses, modules and objects by their contents
in order; functions by their code (bytecode, constants, names), defaults, closure and the
globals their code names; and an object met twice by its first visit's index. fedleak's own
source files enter as one digest (an edited module is a new key); a user's code (a model
factory's module, a script) is walked, its classes' methods too (an edited ``forward`` is a new
key); a library's (torch, numpy, any package with a ``__version__``, the standard library) is
named with its version. Global settings that change a trace enter the head too: intra-op
threads, the default dtype, oneDNN on or off, deterministic algorithms, matmul precision.
A walk that meets something it cannot read (more than :data:`MAX_OBJECTS` objects, or an
object without a ``__dict__`` or slots) returns None: no key, and the step is traced as usual.

Two problems with the same key trace to the same graph, up to what the key leaves out on
purpose — tensor values — and what Dynamo's saved guards check again on the first call (types,
tensor layouts, constants; :mod:`~fedleak.attacks.optimisation.engine.precompiled`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import platform
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: the most objects one walk visits before it gives up (no key)
MAX_OBJECTS = 50_000
#: libraries named, not walked, whose code is pinned by their version (torch's in the key's
#: head; any other's, numpy, transformers, … as its ``__version__``); the standard library too
NAMED = ("torch", "functorch", "numpy")
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
          torch.layout, torch.memory_format, torch.Size, range, slice, type(Ellipsis))


class Unreadable(Exception):
    """The walk met an object it cannot describe: no key."""


@functools.cache
def fedleak_source_digest() -> str:
    """SHA-256 of every ``.py`` file of the installed fedleak package (path and content)."""
    root = Path(__file__).resolve().parents[3]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def step_fingerprint(roots: Iterable[Any], options: dict[str, Any]) -> str | None:
    """Return the key of the step traced from ``roots`` (module docstring).

    ``roots``: what the step reads (the replay, labels, objective, prior terms, X and λ).

    ``options`` (Inductor's settings, the convolution rule) enter by value. None where the walk
    cannot read what it meets.
    """
    digest = hashlib.sha256()
    head = (torch.__version__, sys.version, platform.machine(), fedleak_source_digest(),
            torch.get_num_threads(),  # Inductor writes the thread count into its loops
            torch.get_default_dtype(), torch._C._get_mkldnn_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
            sorted((str(k), repr(v)) for k, v in options.items()))
    digest.update(repr(head).encode())
    walk = _Walk(digest)
    try:
        for root in roots:
            walk.visit(root, 0)
    except (Unreadable, RecursionError):
        return None
    return digest.hexdigest()


class _Walk:
    """One depth-first walk feeding a digest (:func:`step_fingerprint`)."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.seen: dict[int, int] = {}
        self.kept: list[Any] = []  # keeps visited objects alive: ids stay unique

    def put(self, *parts: object) -> None:
        self.digest.update(repr(parts).encode())
        self.digest.update(b"\x00")

    def visit(self, obj: Any, depth: int) -> None:
        kind = type(obj)
        self.put("type", kind.__module__, kind.__qualname__)
        if not isinstance(obj, type) and _is_users(kind.__module__):
            self.visit(kind, depth)  # a user's class: its methods' code (a model's forward)
        if isinstance(obj, _ATOMS):
            self.put(repr(obj))
            return
        if isinstance(obj, enum.Enum):
            self.put(obj.name)
            return
        if isinstance(obj, torch.Tensor):
            self.put(tuple(obj.shape), obj.dtype, obj.device, obj.layout, obj.requires_grad,
                     obj.stride() if obj.layout == torch.strided else None,
                     isinstance(obj, torch.nn.Parameter))
            return
        if isinstance(obj, np.ndarray):
            self.put(obj.shape, obj.dtype.str, obj.tobytes() if obj.size <= 4096 else None)
            return
        if id(obj) in self.seen:
            self.put("again", self.seen[id(obj)])
            return
        self.seen[id(obj)] = len(self.seen)
        self.kept.append(obj)
        if len(self.seen) > MAX_OBJECTS:
            raise Unreadable("too many objects")
        self.contents(obj, depth + 1)

    def contents(self, obj: Any, depth: int) -> None:
        if isinstance(obj, types.ModuleType):
            self.put(obj.__name__)
        elif isinstance(obj, type):
            self.put(obj.__module__, obj.__qualname__)
            if _is_users(obj.__module__):
                self.methods(obj, depth)
        elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial,
                              types.BuiltinFunctionType, types.CodeType)):
            self.callable(obj, depth)
        elif isinstance(obj, (list, tuple)):
            self.put(len(obj))
            for item in obj:
                self.visit(item, depth)
        elif isinstance(obj, dict):
            self.put(len(obj))
            for key, value in obj.items():
                self.visit(key, depth)
                self.visit(value, depth)
        elif isinstance(obj, (set, frozenset)):
            self.put(sorted(repr(item) for item in obj))
        elif dataclasses.is_dataclass(obj) and not hasattr(obj, "__dict__"):
            for field in dataclasses.fields(obj):
                self.put(field.name)
                self.visit(getattr(obj, field.name), depth)
        else:
            self.attributes(obj, depth)

    def attributes(self, obj: Any, depth: int) -> None:
        found = False
        if hasattr(obj, "__dict__"):
            found = True
            self.visit(dict(vars(obj)), depth)
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name in ("__dict__", "__weakref__"):
                    continue
                found = True
                self.put(name)
                self.visit(getattr(obj, name, None), depth)
        if not found and not _is_plain(obj):
            raise Unreadable(type(obj).__qualname__)

    def methods(self, cls: type, depth: int) -> None:
        """Walk the code of ``cls``'s own functions and its user-written bases'."""
        for base in cls.__mro__:
            if not _is_users(base.__module__):
                continue
            self.put("class", base.__module__, base.__qualname__)
            for name, attribute in vars(base).items():
                function = attribute.__func__ if isinstance(attribute, (staticmethod,
                                                                       classmethod)) \
                    else attribute.fget if isinstance(attribute, property) else attribute
                if isinstance(function, types.FunctionType):
                    self.put("method", name)
                    self.visit(function, depth)

    def callable(self, obj: Any, depth: int) -> None:
        if isinstance(obj, types.MethodType):
            self.visit(obj.__func__, depth)
            self.visit(obj.__self__, depth)
            return
        if isinstance(obj, functools.partial):
            self.visit(obj.func, depth)
            self.visit(obj.args, depth)
            self.visit(obj.keywords, depth)
            return
        if isinstance(obj, types.BuiltinFunctionType):
            self.put(getattr(obj, "__module__", None), obj.__qualname__)
            return
        if isinstance(obj, types.CodeType):
            self.code(obj, depth)
            return
        module = obj.__module__ or ""
        self.put(module, obj.__qualname__)
        if _is_library(module):
            self.put(_library_version(module))
            return  # a library's code: pinned by its version
        self.code(obj.__code__, depth)
        self.visit(obj.__defaults__, depth)
        self.visit(obj.__kwdefaults__, depth)
        self.visit([cell.cell_contents if _filled(cell) else "<empty>"
                    for cell in obj.__closure__ or ()], depth)
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                self.put("global", name)
                self.visit(obj.__globals__[name], depth)

    def code(self, code: types.CodeType, depth: int) -> None:
        self.put(code.co_code, code.co_names, code.co_varnames, code.co_freevars)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const, depth)
            else:
                self.visit(const, depth)


@functools.cache
def _is_library(module: str) -> bool:
    """Tell whether ``module`` is a library's: named, not walked.

    torch, numpy, another package with a ``__version__``, or the standard library; not fedleak
    nor a user's code (walked).
    """
    top = module.split(".")[0]
    if top in NAMED or top in sys.stdlib_module_names or top == "builtins":
        return True
    if top in ("fedleak", "__main__", "tests", ""):
        return False
    return _library_version(module) is not None


def _is_users(module: str) -> bool:
    """Tell whether ``module`` is a user's code: neither a library nor fedleak.

    (fedleak's source is in the key's head.)
    """
    return not _is_library(module) and module.split(".")[0] != "fedleak"


@functools.cache
def _library_version(module: str) -> str | None:
    """Return the ``__version__`` of ``module``'s top-level package, or None.

    torch's is in the key's head, the standard library's is Python's.
    """
    top = sys.modules.get(module.split(".")[0])
    version = getattr(top, "__version__", None)
    return str(version) if version is not None else None


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _global_names(code: types.CodeType) -> list[str]:
    """Every name ``code`` and the code nested in it look up (globals among them)."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return list(dict.fromkeys(names))


def _is_plain(obj: Any) -> bool:
    """Tell whether ``obj`` has no state to read (a bare ``object()``)."""
    return type(obj) is object
