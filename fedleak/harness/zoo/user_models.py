"""The user's own model: an importable ``nn.Module`` factory, ``module:factory``.

A federation's model is the user's code (Flower's quickstart ``Net``), not one of fedleak's
zoo models. ``fedleak victim serve --model pytorchexample.task:Net`` (and ``LeakageAudit(...,
model="pytorchexample.task:Net")``) import ``module`` and call ``factory()`` with no
arguments: a class or a function returning the ``nn.Module`` the federation trains. The model
is checked as a zoo model is: a forward pass on the data's shape must give one logit per
class.

It travels as the model spec ``factory:path=module:factory`` (``Describe``). Importing a
module runs its code, so the *attacker* imports only a factory its own user named
(``fedleak attack --model-factory module:factory``, or :func:`trust`): a victim cannot make an
attacker import what it likes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from fedleak.harness.zoo.model_spec import (  # noqa: F401  (re-exported)
    FACTORY,
    ModelError,
    is_factory,
)

_TRUSTED: set[str] = set()


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
    module_name, _, attribute = path.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelError(f"cannot import {module_name!r} for the model {path!r}: {err} (put "
                         "its folder on PYTHONPATH)") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ModelError(f"module {module_name!r} has no {attribute!r} (model {path!r})")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"{path!r} is not callable: give a class or function returning the "
                         "nn.Module")
    factory: Callable[[], object] = target
    try:
        model = factory()
    except TypeError as err:
        raise ModelError(f"{path}() must build the model with no arguments: {err}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"{path}() returned a {type(model).__name__}, not a torch nn.Module")
    return model
