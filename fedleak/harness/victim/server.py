"""The victim's gRPC server: :func:`start_server` hosts the ``fedleak.v1.Victim`` service
(:class:`~fedleak.harness.victim.servicer.VictimServicer`) with health checking and
reflection enabled, so generic gRPC tools (grpcurl, grpc_health_probe) work, and sizes its
message limit to what a legitimate client of this victim sends (:func:`default_message_bytes`).
"""

from __future__ import annotations

import math
import threading

import torch

from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.release.releaser import MAX_CANDIDATES
from fedleak.harness.victim.servicer import VictimServicer
from fedleak.harness.wire.admission import ServingLimits
from fedleak.harness.wire.handlers import add_service
from fedleak.harness.wire.serving import Server, server_credentials, start_grpc_server
from fedleak.v1 import victim_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Victim"]
SERVICE_NAME = SERVICE.full_name


def needed_message_bytes(victim: Victim) -> int:
    """The largest request a legitimate client sends this victim: the model's parameters and
    buffers (ComputeUpdate, BeginSecAgg), a reconstruction of every user's batch in float64
    (Score), and, for a model that is released, the most KKT candidates Score takes."""
    model = sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                for _, shape, dtype in victim.parameter_infos() + victim.buffer_infos())
    pixels = math.prod(victim.info.shape)
    batch = victim.config.num_users * victim.config.num_images * pixels * 8
    released = MAX_CANDIDATES * pixels * 4 if victim.releaser.output_width == 1 else 0
    return max(model, batch, released)


#: The least message limit a victim takes by default, and gRPC's most.
MIN_MESSAGE_BYTES = 64 << 20
MAX_MESSAGE_BYTES = (2 << 30) - (1 << 20)


def default_message_bytes(victim: Victim) -> int:
    """The victim's default message limit: twice what it needs (:func:`needed_message_bytes`)
    and a MiB, at least :data:`MIN_MESSAGE_BYTES`: a larger request is refused by gRPC from its
    declared length before any of it is buffered."""
    return min(MAX_MESSAGE_BYTES, max(MIN_MESSAGE_BYTES, 2 * needed_message_bytes(victim)
                                      + (1 << 20)))


def start_server(
    victim: Victim,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    max_message_bytes: int | None = None,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
    workers: int = 8,
    score_token: str | None = None,
    stopping: threading.Event | None = None,
    limits: ServingLimits | None = None,
) -> tuple[Server, int]:
    """Start serving ``victim``; returns the server and the bound port (``port=0``: a free one).

    ``stopping``, once set, stops every running computation at its next local step (set it
    before stopping the server). ``workers`` threads leave room for Describe and the health
    check while the victim computes (at most 1 + ``max_queued_computations`` compute at once).
    ``limits`` caps what clients may hold (default: :class:`ServingLimits` with
    ``max_message_bytes``, itself by default :func:`default_message_bytes`).
    """
    if limits is None:
        limits = ServingLimits(max_message_bytes=max_message_bytes
                               or default_message_bytes(victim))
    credentials = server_credentials(tls_cert, tls_key)
    servicer = VictimServicer(victim, token, limits, score_token, stopping)
    return start_grpc_server(
        lambda server, pool, admission: add_service(server, servicer, SERVICE, pool, admission),
        SERVICE_NAME, host, port,
        options=[("grpc.max_send_message_length", limits.max_message_bytes)],
        credentials=credentials, workers=workers, limits=limits,
    )
