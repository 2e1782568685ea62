"""The server's side of secure aggregation over gRPC, as the attacker runs it.

The attacker asks the victim's users to start a round (``BeginSecAgg``), then plays
:class:`~fedleak.defenses.secagg.SecAggServer` against them, one ``SecAggStep`` call per user
and phase. A user that stops answering (``UNAVAILABLE``) is treated as dropped out and the
protocol carries on with the others, as long as the threshold allows. What the attacker gets is
exactly what a real server sees: the transcript (public keys, encrypted shares, masked vectors,
unmasking shares) and the unmasked sum of the survivors' updates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc
import numpy as np
import torch

from fedleak.defenses.secagg import (
    AdvertiseKeys,
    MaskedInput,
    SecAggConfig,
    SecAggResult,
    SecAggServer,
    SecAggTranscript,
    ShareKeys,
    UnmaskingShares,
)
from fedleak.defenses.secagg.messages import M, decode_as
from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient, VictimError
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.wire.protocol_spec import protocol_from_pb
from fedleak.v1 import victim_pb2 as pb

PHASE_NAMES: dict[int, str] = {
    pb.ADVERTISE_KEYS: "advertise-keys", pb.SHARE_KEYS: "share-keys",
    pb.MASKED_INPUT: "masked-input", pb.UNMASKING: "unmasking",
}


@dataclass
class AggregationRound:
    """One finished secure-aggregation round, from the server's side."""

    begin: pb.BeginSecAggResponse
    result: SecAggResult
    transcript: SecAggTranscript
    offline: dict[int, str] = field(default_factory=dict)  # user → phase it stopped answering


def run_secagg(
    client: VictimClient,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    protocol: Protocol | None = None,
    audit_id: str = "",
) -> AggregationRound:
    """Drive one round of SecAgg with the victim's users; raises ``SecAggAbort`` below t.
    With ``audit_id`` the round is that audit's next trial."""
    begin = client.begin_secagg(parameters, buffers, protocol, audit_id)
    config = SecAggConfig(threshold=begin.threshold, clip=begin.clip,
                          vector_length=begin.vector_length, num_users=len(begin.user_ids),
                          session=begin.session)
    server = SecAggServer(config)
    alive = list(begin.user_ids)
    offline: dict[int, str] = {}

    def ask(phase: pb.SecAggPhase, payload: Callable[[int], bytes | None],
            kind: type[M]) -> list[M]:
        replies: list[M] = []
        for user in list(alive):
            message = payload(user)
            if message is None:
                continue
            try:
                replies.append(decode_as(client.secagg_step(begin.round_id, user, phase, message),
                                         kind))
            except VictimError as err:
                if err.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                alive.remove(user)
                offline[user] = PHASE_NAMES[phase]
                if not alive:
                    _victim_gone(client, PHASE_NAMES[phase], err)
        return replies

    share_request = server.advertise_keys(ask(pb.ADVERTISE_KEYS, lambda u: b"", AdvertiseKeys))
    masked_requests = server.share_keys(ask(pb.SHARE_KEYS, lambda u: share_request.to_bytes(),
                                            ShareKeys))
    unmask_request = server.masked_input_collection(
        ask(pb.MASKED_INPUT, lambda u: masked_requests[u].to_bytes() if u in masked_requests
            else None, MaskedInput)
    )
    result = server.unmasking(ask(pb.UNMASKING, lambda u: unmask_request.to_bytes(),
                                  UnmaskingShares))
    return AggregationRound(begin, result, server.transcript, offline)


def _victim_gone(client: VictimClient, phase: str, last: VictimError) -> None:
    """Every user went ``UNAVAILABLE``: when the victim process itself no longer answers
    ``Describe`` (stopped by a signal, killed, or its connection lost), say so — not a dropout
    of every user."""
    try:
        client.describe()
    except VictimError as err:
        raise VictimError(grpc.StatusCode.UNAVAILABLE,
                          f"the victim process stopped answering during secure aggregation's "
                          f"{phase} phase (every user and Describe are unavailable: it was "
                          f"stopped, e.g. by SIGTERM, or died — not a dropout; {last.details}; "
                          f"then {err.details}); restart it and run the round again") from None


def as_received_update(
    aggregation: AggregationRound,
    names: list[str],
    shapes: list[tuple[int, ...]],
    target: str = "sum",
) -> ReceivedUpdate:
    """What to attack: the unmasked sum (``sum``) or one user's masked vector (``user:U``)."""
    begin = aggregation.begin
    if target == "sum":
        vector, users = aggregation.result.total, list(aggregation.result.survivors)
    else:
        user = int(target.split(":", 1)[1])
        vector, users = aggregation.transcript.masked_update(user), [user]
    update, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        update.append(torch.from_numpy(vector[start:start + size].astype(np.float32))
                      .view(shape))
        start += size
    metadata = dict(begin.metadata)
    metadata.update({"secagg_target": target, "images_per_user": str(begin.images_per_user),
                     "secagg_survivors": ",".join(map(str, users)),
                     "secagg_offline": ",".join(f"{u}@{p}" for u, p in
                                                sorted(aggregation.offline.items()))})
    return ReceivedUpdate(
        round_id=begin.round_id,
        names=names,
        update=update,
        update_kind=begin.update_kind,
        protocol=protocol_from_pb(begin.protocol),
        num_images=begin.images_per_user * len(users),
        local_steps=begin.local_steps,
        metadata=metadata,
        user_ids=users,
    )
