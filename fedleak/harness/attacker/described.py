"""What the victim publishes through ``Describe``, as the server's typed objects.

The architecture, the data description and the protocol are public (Kerckhoffs): the server
builds its own copy of the model from the published spec and checks it against the victim's
parameter list, so both sides differentiate the same function.
"""

from __future__ import annotations

import grpc
import torch
from torch import nn

from fedleak.attacks.published import PublishedDefense, published
from fedleak.harness.attacker.attack_settings import AttackSettings
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.wire.protocol_spec import protocol_from_pb
from fedleak.harness.zoo.datasets import DatasetInfo
from fedleak.harness.zoo.models import ModelSpec, build_model, load_checkpoint
from fedleak.v1 import victim_pb2 as pb


def dataset_info(described: pb.DescribeResponse) -> DatasetInfo:
    """The published data description: shape, classes, normalisation."""
    d = described.data
    shape = tuple(d.shape)
    if len(shape) != 3:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the victim publishes a data shape {list(shape)}; expected [C, H, W]")
    return DatasetInfo(
        name=d.dataset,
        shape=(shape[0], shape[1], shape[2]),
        num_classes=d.num_classes,
        mean=tuple(d.mean),
        std=tuple(d.std),
        class_names=tuple(d.class_names),
    )


def model_spec(described: pb.DescribeResponse) -> ModelSpec:
    return ModelSpec(described.model.name, dict(described.model.options))


def victim_protocol(described: pb.DescribeResponse) -> Protocol:
    """The protocol the victim runs when the server asks for nothing else."""
    return protocol_from_pb(described.protocol)


def server_model(described: pb.DescribeResponse) -> nn.Module:
    """The architecture the victim published, checked against its parameter list."""
    spec = model_spec(described)
    info = dataset_info(described)
    model = build_model(spec, info.shape, info.num_classes)
    ours = [(n, list(p.shape)) for n, p in model.named_parameters()]
    theirs = [(p.name, list(p.shape)) for p in described.parameters]
    if ours != theirs:
        raise VictimError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the victim's {spec} does not match this fedleak's build of it; "
            "run the same fedleak version on both sides",
        )
    return model


def global_parameters(
    client: VictimClient, described: pb.DescribeResponse, settings: AttackSettings
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """θ to send: a checkpoint of ours, a fresh seeded init, or the federation's global model."""
    if settings.checkpoint is None and settings.model_seed is None:
        return client.global_model()
    if settings.model_seed is not None:
        torch.manual_seed(settings.model_seed)
    model = server_model(described)
    if settings.checkpoint:
        load_checkpoint(model, settings.checkpoint)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


def published_defenses(described: pb.DescribeResponse) -> tuple[PublishedDefense, ...]:
    """The victim's published defense chain as the attacks' typed values."""
    return published((d.name, dict(d.params), d.stage) for d in described.defenses)


def defense_specs(described: pb.DescribeResponse) -> list[str]:
    """The victim's published defense chain as ``name:key=value,...`` strings."""
    return [d.spec() for d in published_defenses(described)]
