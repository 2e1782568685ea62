"""A third-party defense outside fedleak: scaled sign compression behind ``DefenseService``.

Copy this file to write your own out-of-process defense. It depends on grpcio, numpy and the
Python stubs of ``protos/fedleak/v1/{victim,defense}.proto``; here they come from the installed
``fedleak.v1`` package, elsewhere generate them with::

    python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. \\
        protos/fedleak/v1/victim.proto protos/fedleak/v1/defense.proto

The mechanism (signSGD of Bernstein et al. 2018, scaled as the compressor of Karimireddy et
al. 2019, "Error Feedback Fixes SignSGD", eq. 3)::

    Δ'_l = (‖Δ_l‖₁ / d_l) · sign(Δ_l)        for every tensor l with d_l entries

keeps one magnitude per tensor and one bit per entry. It is deterministic, so it ignores the
seed the victim sends. Run it and point a victim at it::

    python examples/remote_defense/sign_server.py --port 50062
    fedleak victim serve --defense remote:address=127.0.0.1:50062
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Iterable, Iterator
from concurrent import futures

import grpc
import numpy as np

from fedleak.v1 import defense_pb2, defense_pb2_grpc, victim_pb2

CHUNK_BYTES = 1 << 20  # keep every reply message far below gRPC's default 4 MiB limit
FLOAT_DTYPES = {victim_pb2.FLOAT32: np.dtype("<f4"), victim_pb2.FLOAT64: np.dtype("<f8")}


class BadUpdate(ValueError):
    """A chunk stream this service cannot use; the message goes back as INVALID_ARGUMENT."""


def receive_update(chunks: Iterable[defense_pb2.UpdateChunk]) -> list[tuple[victim_pb2.Tensor,
                                                                           np.ndarray]]:
    """(header, array) per tensor: the chunks of a tensor arrive in order, offsets from 0."""
    tensors: list[tuple[victim_pb2.Tensor, bytearray]] = []
    for chunk in chunks:
        piece = chunk.piece
        if chunk.offset == 0:  # a new tensor starts
            if piece.dtype not in FLOAT_DTYPES:
                raise BadUpdate(f"tensor {piece.name!r}: send FLOAT32 or FLOAT64")
            header = victim_pb2.Tensor(name=piece.name, dtype=piece.dtype, shape=piece.shape)
            tensors.append((header, bytearray()))
        header, data = tensors[-1] if tensors else (None, None)
        if header is None or piece.name != header.name or chunk.offset != len(data):
            raise BadUpdate(f"chunk of {piece.name!r} at offset {chunk.offset} is out of order")
        data += piece.data
    out = []
    for header, data in tensors:
        dtype = FLOAT_DTYPES[header.dtype]
        size = int(np.prod(header.shape, dtype=np.int64))
        if len(data) != size * dtype.itemsize:
            raise BadUpdate(f"tensor {header.name!r}: {len(data)} bytes for shape "
                            f"{list(header.shape)}")
        out.append((header, np.frombuffer(bytes(data), dtype=dtype).reshape(header.shape)))
    return out


def scaled_sign(delta: np.ndarray) -> np.ndarray:
    """(‖Δ‖₁ / d) · sign(Δ), the scale computed in float64, returned in Δ's dtype."""
    scale = np.abs(delta).astype(np.float64).mean() if delta.size else 0.0
    return (np.sign(delta) * scale).astype(delta.dtype)


def send_update(tensors: list[tuple[victim_pb2.Tensor, np.ndarray]]) \
        -> Iterator[defense_pb2.UpdateChunk]:
    """The defended tensors as chunks of the same form: header repeated, bytes from offset."""
    for header, array in tensors:
        data = np.ascontiguousarray(array).tobytes()
        for offset in range(0, max(len(data), 1), CHUNK_BYTES):
            piece = victim_pb2.Tensor(name=header.name, dtype=header.dtype, shape=header.shape,
                                      data=data[offset:offset + CHUNK_BYTES])
            yield defense_pb2.UpdateChunk(piece=piece, offset=offset)


class SignCompression(defense_pb2_grpc.DefenseServiceServicer):
    def Info(self, request: defense_pb2.DefenseInfoRequest, context: grpc.ServicerContext) \
            -> defense_pb2.DefenseInfo:
        return defense_pb2.DefenseInfo(name="sign-compression", params={"scale": "mean-abs"},
                                       stage="update", version="example 1.0")

    def Defend(self, request_iterator: Iterable[defense_pb2.UpdateChunk],
               context: grpc.ServicerContext) -> Iterator[defense_pb2.UpdateChunk]:
        try:
            received = receive_update(request_iterator)
        except BadUpdate as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        yield from send_update([(h, scaled_sign(a)) for h, a in received])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50062, help="0 picks a free port")
    args = parser.parse_args()
    # SO_REUSEPORT off: a second server on a port in use must fail, not share it.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.so_reuseport", 0)])
    defense_pb2_grpc.add_DefenseServiceServicer_to_server(SignCompression(), server)
    try:
        port = server.add_insecure_port(f"{args.host}:{args.port}")
    except RuntimeError:
        port = 0
    if port == 0:
        parser.error(f"cannot bind {args.host}:{args.port}")
    server.start()
    print(f"sign-compression defense listening on {args.host}:{port}", flush=True)
    received: list[int] = []  # a signal handler must take no lock (Event.set could deadlock)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    while not received:
        time.sleep(0.2)
    server.stop(2).wait()


if __name__ == "__main__":
    main()
