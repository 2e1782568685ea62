"""Flower ``ArrayRecord`` ↔ torch tensors, and the checks a reply's arrays must pass.

Arrays cross as Flower serialises them (numpy buffers, never pickle); here they become
``torch`` tensors by copy. A reply is checked against the θ the server sent — the same keys,
shapes and dtypes, finite values — and a mismatch is a sentence the audit records.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn


def tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The record's arrays as torch tensors (copies), in the record's order."""
    return {key: torch.from_numpy(np.array(array.numpy(), copy=True))
            for key, array in record.items()}


def record_of(values: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord holding ``values`` (detached CPU copies), keys in order."""
    return ArrayRecord({key: Array(t.detach().cpu().numpy().copy())
                        for key, t in values.items()})


def split_state(model: nn.Module, state: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``state`` (a state dict) as the model's parameters and its buffers, by the model's names."""
    params = {name: state[name] for name, _ in model.named_parameters()}
    buffers = {name: state[name] for name, _ in model.named_buffers()}
    return params, buffers


def mismatch(sent: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``got`` cannot be a reply to ``sent`` (keys, shapes, dtypes, finiteness), or None."""
    if list(got) != list(sent):
        missing = [k for k in sent if k not in got]
        extra = [k for k in got if k not in sent]
        return (f"its arrays do not match the model's: missing {missing[:5]}, unexpected "
                f"{extra[:5]} (the ClientApp must reply with the whole state dict it was sent)")
    for key, tensor in got.items():
        want = sent[key]
        if tuple(tensor.shape) != tuple(want.shape):
            return (f"array {key!r} has shape {list(tensor.shape)}; the model's is "
                    f"{list(want.shape)}")
        if tensor.dtype != want.dtype:
            return f"array {key!r} has dtype {tensor.dtype}; the model's is {want.dtype}"
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return f"array {key!r} holds NaN or infinite values"
    return None
