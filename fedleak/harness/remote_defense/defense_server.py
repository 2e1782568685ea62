"""``fedleak defense serve``: any registered update or per-example defense behind
``fedleak.v1.DefenseService``.

    fedleak defense serve --port 50061 --defense clip:max-norm=1
    fedleak victim serve --defense remote:address=127.0.0.1:50061

``Info`` names the defense, its public parameters, its stage and its declared mechanism
(:meth:`~fedleak.defenses.stages.Defense.mechanism`, as ``DefenseInfo.claim``). A per-example
defense receives each local step's per-example gradients ([B, *θ_l.shape] per parameter,
the expected batch size in the first chunk) and answers the step's gradient.
``Defend`` assembles the streamed update Δ, applies the defense with a generator seeded by the
seed the victim sent, Δ' = D(Δ; s), and streams Δ' back in chunks of the same form, each tensor
in the dtype it came in. Bad input (a malformed stream, tensors that are not floating point,
empty or not finite, values the defense overflows on) is answered with ``INVALID_ARGUMENT``
and a message naming what to change; the service keeps serving. Health checking and
reflection are on, as on the victim.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import cast

import grpc
import torch

from fedleak import __version__
from fedleak.defenses import Defense, DefenseConfigError, create_defense
from fedleak.defenses.mechanism import PER_EXAMPLE, UPDATE
from fedleak.defenses.stages import PerExampleDefense, UpdateDefense
from fedleak.harness.remote_defense.declaration import mechanism_to_pb
from fedleak.harness.remote_defense.wire import (
    DEFAULT_CHUNK_BYTES,
    UpdateStreamError,
    assemble_update,
    update_chunks,
)
from fedleak.harness.wire.admission import (
    DEFAULT_MAX_CALLS_PER_PEER,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    Refused,
    ServingLimits,
)
from fedleak.harness.wire.handlers import add_service, check_message
from fedleak.harness.wire.quoting import quoted
from fedleak.harness.wire.serving import Server, server_credentials, start_grpc_server
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc

log = logging.getLogger(__name__)

SERVICE = dpb.DESCRIPTOR.services_by_name["DefenseService"]
SERVICE_NAME = SERVICE.full_name


def served_defense(name: str, params: dict[str, str]) -> Defense:
    """The update or per-example defense ``name`` configured by ``params`` (by the stage it
    declares); parameter checks and transport defenses are refused."""
    defense = create_defense(name, params)
    if defense.stage not in SERVED_STAGES:
        raise DefenseConfigError(f"defense {name!r} acts at stage {defense.stage!r}; only "
                                 "update and per-example defenses can be served out of process "
                                 "(transport ones run among several users, parameter checks "
                                 "need the model)")
    return defense


SERVED_STAGES = (UPDATE, PER_EXAMPLE)


#: Default cap on the bytes of one ``Defend`` stream (``--max-update-mb``): a ResNet-152 update
#: is ~240 MB.
DEFAULT_MAX_UPDATE_BYTES = 1024 << 20
#: Default seconds a ``Defend`` stream may wait between two chunks (``--receive-timeout``).
DEFAULT_RECEIVE_TIMEOUT = 60.0
#: The service's message limit: gRPC's default, four times a chunk (``DEFAULT_CHUNK_BYTES``).
MAX_CHUNK_MESSAGE_BYTES = 4 << 20


class DefenseServicer(dpb_grpc.DefenseServiceServicer):
    """``fedleak.v1.DefenseService`` backed by an in-process :class:`UpdateDefense`.

    ``Info`` and the receiving of ``Defend`` run on the server's event loop (a stalled stream
    holds no thread); the defense itself runs on a worker thread. A stream is refused with
    ``RESOURCE_EXHAUSTED`` once its chunks exceed ``max_update_bytes`` and with
    ``DEADLINE_EXCEEDED`` when no chunk came for ``receive_timeout`` seconds; what it had sent
    is dropped at once, as it is when the client cancels.
    """

    def __init__(self, defense: Defense, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_update_bytes: int = DEFAULT_MAX_UPDATE_BYTES,
                 receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT) -> None:
        self.defense = defense
        self.chunk_bytes = chunk_bytes
        self.max_update_bytes = max_update_bytes
        self.receive_timeout = receive_timeout
        self._lock = threading.Lock()  # a defense may keep state between calls

    async def Info(
        self, request: dpb.DefenseInfoRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DefenseInfo:
        declared = self.defense.declared()
        return dpb.DefenseInfo(
            name=self.defense.name, params=self.defense.public_params(),
            stage=self.defense.stage, version=f"fedleak {__version__}",
            claim=None if declared is None else mechanism_to_pb(declared))

    async def Defend(
        self, request_iterator: AsyncIterator[dpb.UpdateChunk],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[dpb.UpdateChunk]:
        chunks = await self._receive(request_iterator, context)
        if context.cancelled():  # the client went away: its stream ended early, drop it
            chunks.clear()
            return
        try:
            defended, names = await asyncio.get_running_loop().run_in_executor(
                None, self._defend, chunks)
        except DefendRefused as err:
            raise Refused(err.code, str(err)) from None
        for chunk in update_chunks(defended, names, chunk_bytes=self.chunk_bytes):
            yield chunk

    async def _receive(self, request_iterator: AsyncIterator[dpb.UpdateChunk],
                       context: grpc.aio.ServicerContext) -> list[dpb.UpdateChunk]:
        """The stream's chunks, within the byte cap and the receive timeout. Whatever ends
        the stream early (a refusal, the client cancelling) drops the chunks at once: a
        cancelled coroutine's frame can outlive the call in a reference cycle."""
        chunks: list[dpb.UpdateChunk] = []
        try:
            await self._read_into(chunks, aiter(request_iterator), context)
        except BaseException:
            chunks.clear()
            raise
        return chunks

    async def _read_into(self, chunks: list[dpb.UpdateChunk],
                         iterator: AsyncIterator[dpb.UpdateChunk],
                         context: grpc.aio.ServicerContext) -> None:
        total = 0
        while True:
            try:
                chunk = await asyncio.wait_for(anext(iterator), self.receive_timeout)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise Refused(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no chunk for {self.receive_timeout:g} s: send the update's chunks without "
                    "pausing (the service's --receive-timeout)") from None
            check_message(chunk)
            total += len(chunk.piece.data)
            if total > self.max_update_bytes:
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the update stream passed {self.max_update_bytes >> 20} MiB, this "
                    "service's cap on one update (--max-update-mb); send a smaller update or "
                    "raise the cap")
            chunks.append(chunk)

    def _defend(self, chunks: list[dpb.UpdateChunk]) -> tuple[list[torch.Tensor], list[str]]:
        """Assemble, check and defend the update (on a worker thread); :class:`DefendRefused`
        names what is wrong."""
        pending = deque(chunks)  # each chunk is let go as soon as its bytes are copied
        chunks.clear()
        try:
            received = assemble_update(_draining(pending))
        except UpdateStreamError as err:
            raise DefendRefused(str(err)) from None
        finally:
            pending.clear()
        if not received.tensors:
            raise DefendRefused("the update has no tensors")
        problem = _refusal(received.names, received.tensors)
        if problem:
            raise DefendRefused(problem)
        generator = torch.Generator().manual_seed(received.seed)
        per_example = self.defense.stage == PER_EXAMPLE
        if per_example:
            problem = _per_example_refusal(received.names, received.tensors,
                                           received.expected_batch_size)
            if problem:
                raise DefendRefused(problem)
        try:
            with self._lock:
                if per_example:
                    privatise = cast(PerExampleDefense, self.defense).privatise
                    defended = privatise(received.tensors, received.expected_batch_size,
                                         generator)
                    defended = _as_received([t[0] for t in received.tensors], defended)
                else:
                    apply = cast(UpdateDefense, self.defense).apply
                    defended = _as_received(received.tensors, apply(received.tensors,
                                                                    generator))
        except Exception as err:  # noqa: BLE001 - the service must keep serving
            log.exception("defense %s failed", self.defense.name)
            raise DefendRefused(f"defense {self.defense.name!r} failed: {type(err).__name__}: "
                                f"{err}", grpc.StatusCode.INTERNAL) from None
        overflowed = [n for n, t in zip(received.names, defended, strict=True)
                      if not bool(torch.isfinite(t).all())]
        if overflowed:  # finite in, not finite out: never answered (the contract says finite)
            raise DefendRefused(
                f"defense {self.defense.name!r} overflowed to NaN or infinite values in update "
                f"tensors {_listed(overflowed)} (values near the largest their dtype holds); "
                "send smaller values or a wider dtype such as FLOAT32")
        return defended, received.names


def _draining(chunks: deque[dpb.UpdateChunk]) -> Iterator[dpb.UpdateChunk]:
    while chunks:
        yield chunks.popleft()


class DefendRefused(Exception):
    """Why an update is not defended, and the status that says so."""

    def __init__(self, message: str,
                 code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


def _listed(names: list[str], limit: int = 5) -> str:
    """Tensor names for a message: quoted, at most ``limit`` of them."""
    shown = ", ".join(quoted(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _refusal(names: list[str], tensors: list[torch.Tensor]) -> str:
    """Why an assembled update cannot be defended ("" if it can): every tensor must hold
    finite floats, at least one of them (the victim never sends less)."""
    named = list(zip(names, tensors, strict=True))
    not_float = [n for n, t in named if not t.is_floating_point()]
    if not_float:
        return (f"update tensors {_listed(not_float)} are not floating point; send the update "
                "as float tensors")
    empty = [n for n, t in named if t.numel() == 0]
    if empty:
        return (f"update tensors {_listed(empty)} hold no values (a zero dimension); send only "
                "tensors with at least one value")
    not_finite = [n for n, t in named if not bool(torch.isfinite(t).all())]
    if not_finite:
        return (f"update tensors {_listed(not_finite)} contain NaN or infinite values; send a "
                "finite update")
    return ""


def _per_example_refusal(names: list[str], tensors: list[torch.Tensor], batch: int) -> str:
    """Why per-example gradients cannot be privatised ("" if they can): one row count across
    every tensor, and the expected batch size in the first chunk."""
    if batch < 1:
        return ("a per-example service needs expected_batch_size >= 1 in the first chunk "
                "(the batch size the step's sum is divided by)")
    rows = {int(t.shape[0]) if t.dim() else -1 for t in tensors}
    if len(rows) != 1 or -1 in rows:
        return (f"per-example tensors {_listed(names)} must each hold one row per example, "
                f"[B, *parameter shape], with the same B; got {sorted(rows)}")
    return ""


def _as_received(received: list[torch.Tensor], defended: list[torch.Tensor]) \
        -> list[torch.Tensor]:
    """The defended tensors in the dtypes they came in (a defense over the whole update may
    promote, e.g. ``torch.cat`` of float32 and float64); the count and shapes must match."""
    if len(defended) != len(received):
        raise ValueError(f"the defense returned {len(defended)} tensors for {len(received)}")
    for before, after in zip(received, defended, strict=True):
        if after.shape != before.shape:
            raise ValueError(f"the defense returned shape {list(after.shape)} for "
                             f"{list(before.shape)}")
    return [after.to(before.dtype) for before, after in zip(received, defended, strict=True)]


def start_defense_server(
    defense: Defense, host: str = "127.0.0.1", port: int = 0, workers: int = 4,
    tls_cert: bytes | None = None, tls_key: bytes | None = None,
    max_update_bytes: int = DEFAULT_MAX_UPDATE_BYTES,
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT,
    max_calls_per_peer: int = DEFAULT_MAX_CALLS_PER_PEER,
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
) -> tuple[Server, int]:
    """Serve ``defense``; returns the server and the bound port (``port=0``: a free one).

    With ``tls_cert`` and ``tls_key`` (PEM) the service speaks TLS; victims then link to it
    with ``remote:address=HOST:PORT,tls-ca=CERT.pem``.
    """
    servicer = DefenseServicer(defense, max_update_bytes=max_update_bytes,
                               receive_timeout=receive_timeout)
    credentials = server_credentials(tls_cert, tls_key)
    limits = ServingLimits(max_message_bytes=MAX_CHUNK_MESSAGE_BYTES,
                           receive_timeout=receive_timeout,
                           max_calls_per_peer=max_calls_per_peer,
                           max_connections_per_peer=max_connections_per_peer)
    return start_grpc_server(
        lambda server, pool, admission: add_service(server, servicer, SERVICE, pool, admission),
        SERVICE_NAME, host, port, workers=workers, credentials=credentials, limits=limits)
