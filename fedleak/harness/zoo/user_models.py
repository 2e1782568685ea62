"""The user's own model: an importable ``nn.Module`` factory, ``module:factory``.

A federation's model is the user's code (Flower's quickstart ``Net``), not one of fedleak's
zoo models. ``fedleak victim serve --model pytorchexample.task:Net`` (and ``LeakageAudit(...,
model="pytorchexample.task:Net")``) import ``module`` and call ``factory()`` with no
arguments: a class or a function returning the ``nn.Module`` the federation trains. The model
is checked as a zoo model is: a forward pass on the data's shape must give one logit per
class.

The user's code is run under guard: every exception it raises — importing the module,
calling the factory or the trial forward, ``SystemExit`` and ``KeyboardInterrupt`` included —
is a :class:`ModelError` naming it ("the factory t6:boom raised RuntimeError: …"); a factory
that takes arguments is told so before it is called (a ``TypeError`` raised *inside* it is
reported as its own); a model with no trainable parameters is refused (the server's update
would be empty); and importing plus building must finish within
:data:`FACTORY_DEADLINE_S` seconds (``FEDLEAK_FACTORY_DEADLINE`` overrides it), so a factory
that hangs fails the start instead of hanging it.

It travels as the model spec ``factory:path=module:factory`` (``Describe``). Importing a
module runs its code, so the *attacker* imports only a factory its own user named
(``fedleak attack --model-factory module:factory``, or :func:`trust`): a victim cannot make an
attacker import what it likes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from torch import nn

from fedleak.harness.zoo.model_spec import (  # noqa: F401  (re-exported)
    FACTORY,
    ModelError,
    is_factory,
)

_TRUSTED: set[str] = set()
#: Seconds importing and calling a factory (and its trial forward) may take at start.
FACTORY_DEADLINE_S = 300.0
T = TypeVar("T")


def factory_deadline() -> float:
    """:data:`FACTORY_DEADLINE_S`, or the seconds ``FEDLEAK_FACTORY_DEADLINE`` gives."""
    raw = os.environ.get("FEDLEAK_FACTORY_DEADLINE", "")
    try:
        value = float(raw) if raw else FACTORY_DEADLINE_S
    except ValueError:
        raise ModelError(f"FEDLEAK_FACTORY_DEADLINE={raw!r} is not a number of seconds") \
            from None
    if not value > 0:
        raise ModelError(f"FEDLEAK_FACTORY_DEADLINE={raw!r} must be a positive number of "
                         "seconds")
    return value


def run_user_code(what: str, call: Callable[[], T]) -> T:
    """Return ``call()``, the user's code, within :func:`factory_deadline` seconds.

    Any exception it raises (``SystemExit`` and ``KeyboardInterrupt`` included) becomes a
    :class:`ModelError` saying "``what`` raised <type>: <message>"; a call still running at the
    deadline is left in a daemon thread and reported as hanging.
    """
    seconds = factory_deadline()
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as err:  # noqa: BLE001 - the user's code: every failure is named
            failure.append(err)

    worker = threading.Thread(target=target, name="user-model-factory", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise ModelError(f"{what} did not return within {seconds:g} s (a factory that hangs? "
                         "raise FEDLEAK_FACTORY_DEADLINE if it is only slow)")
    if failure:
        err = failure[0]
        if isinstance(err, ModelError):
            raise err
        raise ModelError(f"{what} raised {type(err).__name__}: {err}") from None
    return result[0]


def trust(path: str) -> None:
    """Allow this process to import the factory ``path`` (the CLI's ``--model`` on the victim,
    ``--model-factory`` on the attacker)."""
    if not is_factory(path):
        raise ModelError(f"{path!r} does not name a factory: give module:factory, e.g. "
                         "pytorchexample.task:Net")
    _TRUSTED.add(path.strip())


def user_model(path: str) -> nn.Module:
    """``factory()`` of ``module:factory`` (trusted by the caller: it named it), checked to be
    an ``nn.Module``; :class:`ModelError` saying what to change otherwise."""
    trust(path)
    return _build(path.strip())


def build_factory(path: str) -> nn.Module:
    """The model spec ``factory:path=...`` as built where it was *published* (an attacker
    reading a victim's ``Describe``): only a :func:`trust` ed factory is imported."""
    if path not in _TRUSTED:
        raise ModelError(f"the model is the user's own factory {path!r}: this process imports "
                         "only a factory its user named; start it with --model-factory "
                         f"{path} (the module on PYTHONPATH)")
    return _build(path)


def _build(path: str) -> nn.Module:
    return run_user_code(f"the factory {path}", lambda: _import_and_call(path))


def _import_and_call(path: str) -> nn.Module:
    module_name, _, attribute = path.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelError(f"cannot import {module_name!r} for the model {path!r}: {err} (put "
                         "its folder on PYTHONPATH)") from None
    except BaseException as err:  # noqa: BLE001 - the module's own code failed
        raise ModelError(f"importing {module_name!r} for the factory {path} raised "
                         f"{type(err).__name__}: {err}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ModelError(f"module {module_name!r} has no {attribute!r} (model {path!r})")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"{path!r} is not callable: give a class or function returning the "
                         "nn.Module")
    factory: Callable[[], object] = target
    try:
        inspect.signature(factory).bind()
    except TypeError as err:
        raise ModelError(f"{path}() must build the model with no arguments: {err}") from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass
    try:
        model = factory()
    except BaseException as err:  # noqa: BLE001 - the user's code: every failure is named
        raise ModelError(f"the factory {path} raised {type(err).__name__}: {err}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"{path}() returned a {type(model).__name__}, not a torch nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(f"the model {path}() built has no trainable parameters: a user "
                         "would send an empty update; return the model the federation trains")
    return model
