"""A server-designed architecture around the user's model, as sweep points spell it.

A ``[[sweep.attack]]`` table may name the architecture a malicious server distributed
(``architecture = "imprint:bins=256"``): that attack's points run every model of the grid inside
it (:func:`server_architecture`), and the report counts the wrapped model as the user's own
(:func:`user_model`), so honest and malicious attacks on one defense setting share a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedleak.harness.zoo.models import ModelError, ModelSpec

#: key of a ``[[sweep.attack]]`` table naming the architecture a malicious server distributed
#: (``imprint:bins=256``): that attack's points run every model of the grid inside it.
ARCHITECTURE_KEY = "architecture"


def split_architecture(options: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A ``[[sweep.attack]]`` table's options as the attack's own options and the
    server-designed architecture it names (None when it names none)."""
    own = {k: v for k, v in options.items() if k != ARCHITECTURE_KEY}
    architecture = options.get(ARCHITECTURE_KEY)
    return own, None if architecture is None else str(architecture)


def user_model(model: str) -> str:
    """The model the user brought, without a server-designed architecture around it (the
    inverse of :func:`server_architecture`): points that differ only in it share a setting."""
    spec = ModelSpec.parse(model)
    if spec.name != "imprint" or "inner" not in spec.options:
        return model
    inner = {k[len("inner."):]: v for k, v in spec.options.items() if k.startswith("inner.")}
    return str(ModelSpec(spec.options["inner"], inner))


def server_architecture(architecture: str, model: str) -> str:
    """``model`` inside the server-designed ``architecture``: ``imprint:bins=256`` around
    ``mlp:width=64`` is ``imprint:bins=256,inner=mlp,inner.width=64``."""
    outer, inner = ModelSpec.parse(architecture), ModelSpec.parse(model)
    if outer.name != "imprint":
        raise ModelError(f"architecture {architecture!r}: the server-designed architecture "
                         "must be an imprint block (imprint:bins=K)")
    options = {**outer.options, "inner": inner.name,
               **{f"inner.{k}": v for k, v in inner.options.items()}}
    return str(ModelSpec(outer.name, options))
