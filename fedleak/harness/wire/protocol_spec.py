"""The protocol on the wire: :class:`~fedleak.harness.federated.protocol.Protocol` ↔
``fedleak.v1.ProtocolSpec``.

A ``ProtocolSpec`` in a round-starting request is the server's choice for that round: zero (or
empty) fields keep the user's own setting, and so do the optimiser fields (momentum, weight
decay, Nesterov, shuffle: explicit presence) a server leaves unset, so :func:`changes_from_pb`
reads only the fields a server set. ``num_images`` is the user's, never the server's, and
travels only in answers.
"""

from __future__ import annotations

from fedleak.harness.federated.protocol import Protocol, ProtocolChanges
from fedleak.v1 import victim_pb2 as pb


def protocol_to_pb(protocol: Protocol, num_images: int = 0) -> pb.ProtocolSpec:
    """Every field of ``protocol`` (and the user's batch size n) as a ``ProtocolSpec``."""
    return pb.ProtocolSpec(
        kind=protocol.kind,
        num_images=num_images,
        local_epochs=protocol.local_epochs,
        batch_size=protocol.batch_size,
        learning_rate=protocol.learning_rate,
        batchnorm=protocol.batchnorm,
        momentum=protocol.momentum,
        weight_decay=protocol.weight_decay,
        nesterov=protocol.nesterov,
        shuffle=protocol.shuffle,
    )


def protocol_from_pb(spec: pb.ProtocolSpec) -> Protocol:
    """A complete ``ProtocolSpec`` (as a victim answers it) as a :class:`Protocol`; optimiser
    fields a victim of an older version leaves unset are plain SGD in order."""
    return Protocol(spec.kind, spec.local_epochs, spec.batch_size, spec.learning_rate,
                    spec.batchnorm or "train", spec.momentum, spec.weight_decay,
                    spec.nesterov, spec.shuffle)


def changes_from_pb(spec: pb.ProtocolSpec) -> ProtocolChanges:
    """The fields a server set in a request (non-zero, non-empty); the rest stay the user's."""
    changes = ProtocolChanges()
    if spec.kind:
        changes["kind"] = spec.kind
    if spec.local_epochs:
        changes["local_epochs"] = spec.local_epochs
    if spec.batch_size:
        changes["batch_size"] = spec.batch_size
    if spec.learning_rate:
        changes["learning_rate"] = spec.learning_rate
    if spec.batchnorm:
        changes["batchnorm"] = spec.batchnorm
    for name in ("momentum", "weight_decay", "nesterov", "shuffle"):
        if spec.HasField(name):
            changes[name] = getattr(spec, name)
    return changes
