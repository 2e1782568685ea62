"""The fields of a score query, read and checked one by one on the node before anything is
scored.

A score query (:mod:`~fedleak.harness.flower.node.node_scoring`) carries a ConfigRecord with the
round, the recovered labels, the padding slots and whether the reconstruction is an
aggregate's, and an ArrayRecord with the images. Every field is checked for its type, its
values and its length before any loop over it, and a field that is not what the node can
score is refused with a :class:`QueryRefused` that names the field and what it must be —
labels or padding of "x", NaN or ∞, a round that is not an integer, a list longer than
:data:`MAX_ENTRIES`, images that are not a floating-point ``[n, C, H, W]`` array — never a
``ValueError`` or ``OverflowError`` out of the node's handler.

On a ClientApp's import path: torch, numpy and Flower's records only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

#: the record names of a score query
SUBMISSION_IMAGES = "fedleak.reconstruction"
SUBMISSION_CONFIG = "fedleak.submission"
#: an entry of the submitted ArrayRecord that the answer echoes as 0 (for Flower's DP mods)
ECHO = "fedleak-echo"
#: the train-config key Flower's client-side clipping mods read (flwr's KEY_CLIPPING_NORM),
#: which a score query carries too
CLIPPING_NORM_KEY = "clipping_norm"
#: the longest labels or padding list a node reads (a node's batch is far smaller)
MAX_ENTRIES = 1 << 20


class QueryRefused(Exception):
    """A score query the node cannot score; the message names the field and what to send."""


@dataclass
class ScoreQuery:
    """A score query's fields, checked (module docstring)."""

    server_round: int
    labels: list[int] = field(default_factory=list)
    padding: list[int] = field(default_factory=list)
    aggregate: bool = False
    images: torch.Tensor | None = None
    #: every array of the submitted ArrayRecord, for the answer's echo
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)


def read_query(content: RecordDict) -> ScoreQuery:
    """The checked fields of a score query's content, or :class:`QueryRefused`."""
    record = content.config_records.get(SUBMISSION_CONFIG)
    if not isinstance(record, ConfigRecord):
        raise QueryRefused(f"a score query carries a ConfigRecord {SUBMISSION_CONFIG!r} with "
                           "the round and the recovered labels")
    config: dict[str, Any] = dict(record)
    server_round = config.get("round")
    if not isinstance(server_round, int) or isinstance(server_round, bool) or server_round < 0:
        raise QueryRefused(f"the score query's round must be the server round, an integer >= 0; "
                           f"got {_shown(server_round)}")
    aggregate = config.get("aggregate", False)
    if not isinstance(aggregate, bool):
        raise QueryRefused(f"the score query's aggregate must be true or false; got "
                           f"{_shown(aggregate)}")
    arrays = _arrays(content.array_records.get(SUBMISSION_IMAGES))
    images = arrays.get("images")
    if images is not None:
        _check_images(images)
    return ScoreQuery(int(server_round), _indices(config, "labels"),
                      _indices(config, "padding"), aggregate, images, arrays)


def _indices(config: dict[str, Any], key: str) -> list[int]:
    """``config[key]`` as a list of integers >= 0 (absent: empty), or :class:`QueryRefused`."""
    what = {"labels": "class indices", "padding": "indices of submitted images"}[key]
    values = config.get(key, [])
    if not isinstance(values, list):
        raise QueryRefused(f"the score query's {key} must be a list of {what} (integers >= 0); "
                           f"got {_shown(values)}")
    if len(values) > MAX_ENTRIES:
        raise QueryRefused(f"the score query's {key} lists {len(values)} entries; a node scores "
                           f"at most {MAX_ENTRIES}: send one per submitted image")
    for i, value in enumerate(values):
        if not _is_int(value) or value < 0:
            raise QueryRefused(f"the score query's {key}[{i}] is {_shown(value)}: {key} are "
                               f"{what}, integers >= 0")
    return [int(v) for v in values]


def _arrays(record: Any) -> dict[str, torch.Tensor]:
    """The submitted arrays as tensors (none: an empty dict), or :class:`QueryRefused`."""
    if record is None:
        return {}
    if not isinstance(record, ArrayRecord):
        raise QueryRefused(f"the score query's {SUBMISSION_IMAGES!r} must be an ArrayRecord")
    out = {}
    for key, array in record.items():
        try:
            values = np.array(array.numpy(), copy=True)
            out[key] = torch.from_numpy(values)
        except (ValueError, TypeError, OverflowError, RuntimeError) as err:
            raise QueryRefused(f"the score query's array {key!r} cannot be read "
                               f"({type(err).__name__}: {err}): send float32 images "
                               "[n, C, H, W] on [0, 1]") from None
    return out


def _check_images(images: torch.Tensor) -> None:
    if not images.is_floating_point():
        raise QueryRefused(f"the submitted images have dtype {images.dtype}: send floating-point "
                           "images [n, C, H, W] on [0, 1]")
    if images.dim() != 4 or images.shape[0] == 0:
        raise QueryRefused(f"the submitted images have shape {list(images.shape)}: send "
                           "[n, C, H, W] on [0, 1], n >= 1")
    if not bool(torch.isfinite(images).all()):
        raise QueryRefused("the submitted images hold NaN or infinite values: send finite "
                           "values on [0, 1]")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A field's value as a reader sees it, short (a list by its type and first entries)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, list):
        head = ", ".join(_shown(v) for v in value[:3])
        return f"a list of {len(value)} [{head}{', ...' if len(value) > 3 else ''}]"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
