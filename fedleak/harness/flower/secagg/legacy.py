"""Flower's legacy FitIns/FitRes layout, which SecAgg+ speaks, beside fedleak's Message layout.

Flower 1.41 runs SecAgg+ only through its legacy workflow API: the ServerApp's
``SecAggPlusWorkflow`` sends each node a ``fitins.parameters`` / ``fitins.config`` train
message and ``secaggplus_mod`` reads the node's ``fitres.*`` reply, while fedleak's ClientApp,
its :class:`~fedleak.harness.flower.node.mods.DefenseMod` and
:func:`~fedleak.harness.flower.node.train. train` speak the Message API (``arrays`` named by the
model's state dict, ``config``, ``metrics``). :class:`LegacyLayout` is the client mod between the
two, so the same ClientApp serves both; :func:`named_state` is what the server-side audit reads
legacy parameters with.

Legacy ``Parameters`` carry no names: their arrays are the model's state dict in order (as
``ndarrays_to_parameters([v.numpy() for v in model.state_dict().values()])`` makes them), and
SecAgg+ hands back float64 arrays; both sides cast them back to the model's dtypes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    Code,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common.recorddict_compat import (
    arrayrecord_to_parameters,
    fitres_to_recorddict,
)

from fedleak.harness.flower.arrays import record_of, tensors

FITINS_PARAMETERS = "fitins.parameters"
FITINS_CONFIG = "fitins.config"


def parameters_of(state: Mapping[str, torch.Tensor]) -> Parameters:
    """``state`` (a state dict) as legacy Parameters, in order."""
    return ndarrays_to_parameters([t.detach().cpu().numpy() for t in state.values()])


def named_state(parameters: Parameters, template: Mapping[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """Legacy ``parameters`` as the state dict ``template`` names, in its dtypes (integer
    buffers rounded); raises ``ValueError`` when the arrays do not fit the template."""
    arrays = parameters_to_ndarrays(parameters)
    if len(arrays) != len(template):
        raise ValueError(f"the parameters hold {len(arrays)} arrays; the model's state dict has "
                         f"{len(template)} entries (legacy parameters are its values in order)")
    out: dict[str, torch.Tensor] = {}
    for (key, want), array in zip(template.items(), arrays, strict=True):
        if tuple(array.shape) != tuple(want.shape):
            raise ValueError(f"array {len(out)} ({key!r} in the model's order) has shape "
                             f"{list(array.shape)}; the model's is {list(want.shape)}")
        value = torch.from_numpy(np.array(array, copy=True))
        if not want.is_floating_point() and value.is_floating_point():
            value = value.round()
        out[key] = value.to(want.dtype)
    return out


class LegacyLayout:
    """A client mod that serves a legacy train message (``fitins.*``, as SecAgg+ sends it) to a
    Message-API ClientApp and turns its reply back into ``fitres.*``.

    ``template`` gives the model's state dict (names, shapes, dtypes) for a node's context.
    Messages of the Message layout pass through untouched. Put it after ``secaggplus_mod``
    and before the mods that read the Message layout (``DefenseMod``).
    """

    def __init__(self, template: Callable[[Context], Mapping[str, torch.Tensor]]) -> None:
        self.template = template

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        records = msg.content.array_records
        if not msg.metadata.message_type.startswith("train") or FITINS_PARAMETERS not in records:
            return call_next(msg, context)
        template = self.template(context)
        state = named_state(arrayrecord_to_parameters(records[FITINS_PARAMETERS], True),
                            template)
        config = msg.content.config_records.get(FITINS_CONFIG, ConfigRecord())
        original = msg.content
        msg.content = RecordDict({"arrays": record_of(state), "config": config})
        try:
            reply = call_next(msg, context)
        finally:
            msg.content = original
        if reply.has_error():
            return reply
        reply.content = _fitres(reply.content, template)
        return reply


def _fitres(content: RecordDict, template: Mapping[str, torch.Tensor]) -> RecordDict:
    """A Message-layout train reply (one ArrayRecord, metrics) as legacy ``fitres.*``."""
    arrays = list(content.array_records.values())
    if len(arrays) != 1:
        raise ValueError(f"the ClientApp replied with {len(arrays)} ArrayRecords; SecAgg+ needs "
                         "one (the node's new state)")
    state = tensors(arrays[0])
    if list(state) != list(template):
        raise ValueError("the ClientApp's reply does not hold the model's state dict in order")
    metrics: dict[str, int | float] = {}
    for record in content.metric_records.values():
        metrics.update({k: v for k, v in record.items() if isinstance(v, int | float)})
    n = metrics.get("num-examples")
    if not isinstance(n, int) or n < 1:
        raise ValueError("the ClientApp's reply carries no num-examples metric (an integer >= "
                         "1): SecAgg+ weighs each node's update by it")
    return fitres_to_recorddict(FitRes(Status(Code.OK, ""), parameters_of(state), n,
                                       dict(metrics)), keep_input=True)

