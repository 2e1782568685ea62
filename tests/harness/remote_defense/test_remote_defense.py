"""The out-of-process defense in-process: the chunk stream, the DefenseService wrapping a
registered defense, and the ``remote`` link checking what a service returns."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from fedleak.defenses import DefenseConfigError, UpdateDefense, create_defense
from fedleak.defenses.clip import Clip, ClipConfig
from fedleak.defenses.noise import Noise, NoiseConfig
from fedleak.harness.remote_defense.defense_server import served_defense, start_defense_server
from fedleak.harness.remote_defense.link import RemoteDefense
from fedleak.harness.remote_defense.wire import (
    UpdateStreamError,
    assemble_update,
    update_chunks,
)
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc
from fedleak.v1 import victim_pb2 as pb


@pytest.fixture()
def served() -> Iterator[Callable[[UpdateDefense], str]]:
    """Start DefenseServices on free loopback ports; stop them after the test."""
    servers = []

    def serve(defense: UpdateDefense) -> str:
        server, port = start_defense_server(defense)
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield serve
    for server in servers:
        server.stop(0)


def test_chunks_round_trip_across_tensor_boundaries() -> None:
    update = [torch.randn(3, 5), torch.randn(7, dtype=torch.float64), torch.zeros(0),
              torch.arange(4)]
    names = ["a", "b", "empty", "ints"]
    chunks = list(update_chunks(update, names, seed=42, chunk_bytes=7))
    assert max(len(c.piece.data) for c in chunks) == 7
    assert [c.seed for c in chunks].count(42) == 1 and chunks[0].seed == 42
    back = assemble_update(chunks)
    assert back.names == names and back.seed == 42
    for sent, got in zip(update, back.tensors, strict=True):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


def _chunk(name: str, offset: int, data: bytes, shape: tuple[int, ...] = (2,)) \
        -> dpb.UpdateChunk:
    return dpb.UpdateChunk(piece=pb.Tensor(name=name, dtype=pb.FLOAT32, shape=list(shape),
                                           data=data), offset=offset)


@pytest.mark.parametrize("chunks, words", [
    ([_chunk("w", 0, b"\0" * 4), _chunk("w", 8, b"\0" * 4)], ["offset 8, expected 4"]),
    ([_chunk("w", 0, b"\0" * 12)], ["more than the 8 bytes"]),
    ([_chunk("w", 0, b"\0" * 4)], ["needs 8 bytes, got 4"]),
    ([_chunk("w", 0, b"\0" * 8), _chunk("w", 0, b"\0" * 8)], ["'w' is sent twice"]),
    ([_chunk("w", 0, b"\0" * 4), _chunk("v", 4, b"\0" * 4)], ["does not continue 'w'"]),
    ([_chunk("", 0, b"\0" * 8)], ["has no name"]),
    ([_chunk("w", 0, b"", shape=(-1,))], ["negative dimension"]),
])
def test_malformed_chunk_streams_are_refused_with_the_reason(chunks: list, words: list) -> None:
    with pytest.raises(UpdateStreamError) as err:
        assemble_update(chunks)
    for word in words:
        assert word in str(err.value)


def test_remote_clip_is_exactly_the_local_clip_and_a_large_update_passes(served) -> None:
    clip = Clip(ClipConfig(max_norm=0.5))
    remote = create_defense("remote", {"address": served(clip)})  # found by entry point
    assert isinstance(remote, RemoteDefense)
    # 5M float32 = 20 MB: five times gRPC's default 4 MiB message limit on both ends
    update = [torch.randn(2_500_000), torch.randn(50, 50_000), torch.randn(3)]
    remote.bind(["big", "bigger", "small"])
    got = remote.apply(update, torch.Generator().manual_seed(0))
    expected = clip.apply(update, torch.Generator())
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    params = remote.public_params()
    assert params["remote-name"] == "clip" and params["remote.max-norm"] == "0.5"
    assert params["address"] == remote.config.address and params["stage"] == "update"
    remote.close()


def test_remote_noise_draws_from_the_seed_the_victim_sends(served) -> None:
    noise = Noise(NoiseConfig(sigma=0.1))
    remote = create_defense("remote", {"address": served(noise)})
    update = [torch.zeros(10, 10), torch.zeros(4)]
    generator = torch.Generator().manual_seed(7)
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator.clone_state()))
    got = remote.apply(update, generator)
    expected = noise.apply(update, torch.Generator().manual_seed(seed))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    again = remote.apply(update, generator)  # the generator moved on: fresh noise
    assert not torch.equal(again[0], got[0])
    assert float(torch.cat([g.flatten() for g in got]).std()) == pytest.approx(0.1, rel=0.3)


class Misbehaving(dpb_grpc.DefenseServiceServicer):
    """A DefenseService that answers wrongly in the way ``mode`` says."""

    def __init__(self) -> None:
        self.mode = "ok"

    def Info(self, request: object, context: object) -> dpb.DefenseInfo:
        return dpb.DefenseInfo(name="misbehaving", stage="update")

    def Defend(self, request_iterator: object, context: grpc.ServicerContext) -> Iterator:
        received = assemble_update(request_iterator)
        tensors, names = received.tensors, received.names
        if self.mode == "nan":
            tensors = [t * float("nan") for t in tensors]
        elif self.mode == "shape":
            tensors = [t.flatten() for t in tensors]
        elif self.mode == "missing":
            tensors, names = tensors[:-1], names[:-1]
        elif self.mode == "refuse":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "I only take even sizes")
        elif self.mode in ("huge", "longer"):  # 4 GiB declared, or bytes beyond the shape
            self.sent = 0
            shape = [1 << 30] if self.mode == "huge" else [2, 3]
            offset = 0
            while self.sent < 4096:  # 4 GiB in 1 MiB chunks, were they all read
                # "longer": the shape's 24 bytes, then 1 MiB pieces beyond it (big pieces, so
                # HTTP/2 flow control, not the machine's load, bounds how many are sent ahead)
                first = self.mode == "longer" and self.sent == 0
                piece = pb.Tensor(name="w", dtype=pb.FLOAT32, shape=shape,
                                  data=bytes(24 if first else 1 << 20))
                self.sent += 1
                yield dpb.UpdateChunk(piece=piece, offset=offset)
                offset += len(piece.data)
            return
        yield from update_chunks(tensors, names)


@pytest.fixture()
def misbehaving() -> Iterator[tuple[Misbehaving, str]]:
    from concurrent import futures

    servicer = Misbehaving()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dpb_grpc.add_DefenseServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize("mode, words", [
    ("nan", ["NaN or infinite", "'w'"]),
    ("shape", ["tensor 0 is 'w' [6] FLOAT32", "expected 'w' [2, 3] FLOAT32"]),
    ("missing", ["1 tensor(s), expected 2"]),
    ("huge", ["tensor 0 is 'w' [1073741824] FLOAT32", "expected 'w' [2, 3] FLOAT32"]),
    ("longer", ["'w': more than the 24 bytes"]),
    ("refuse", ["refused the update", "INVALID_ARGUMENT", "even sizes"]),
])
def test_a_wrong_answer_of_the_service_is_refused_naming_it(misbehaving, mode: str,
                                                            words: list[str]) -> None:
    servicer, address = misbehaving
    remote = create_defense("remote", {"address": address})
    remote.bind(["w", "b"])
    update = [torch.ones(2, 3), torch.ones(3)]
    servicer.mode = mode
    with pytest.raises(FailedPrecondition) as err:
        remote.apply(update, torch.Generator())
    assert f"remote defense 'misbehaving' at {address}" in str(err.value)
    for word in words:
        assert word in str(err.value)
    if mode in ("huge", "longer"):  # refused at the first byte too many, the rest unread
        assert servicer.sent < 64
    servicer.mode = "ok"  # the link recovers with the service
    assert torch.equal(remote.apply(update, torch.Generator())[0], update[0])


def test_a_dead_service_is_named_at_start_and_later(served) -> None:
    with pytest.raises(DefenseConfigError, match="no defense service answered at 127.0.0.1:1 "):
        create_defense("remote", {"address": "127.0.0.1:1", "connect-timeout": "0.5"})
    server, port = start_defense_server(Clip())
    remote = create_defense("remote", {"address": f"127.0.0.1:{port}"})
    server.stop(0).wait()
    with pytest.raises(FailedPrecondition, match="is unreachable") as err:
        remote.apply([torch.ones(2)], torch.Generator())
    assert f"127.0.0.1:{port}" in str(err.value)
    server, _ = start_defense_server(Clip(), port=port)  # back at the same address
    try:
        for _ in range(40):  # gRPC reconnects with its own backoff (about a second here)
            try:
                got = remote.apply([torch.ones(2)], torch.Generator())
                break
            except FailedPrecondition:
                time.sleep(0.25)
        else:
            pytest.fail("the remote link did not reconnect to the restarted service in 10 s")
        assert torch.equal(got[0], torch.ones(2) / 2**0.5)
    finally:
        server.stop(0)


@pytest.mark.parametrize("params, words", [
    ({}, ["address must be HOST:PORT"]),
    ({"address": "localhost"}, ["address must be HOST:PORT", "'localhost'"]),
    ({"address": "127.0.0.1:1", "stage": "transport"}, ["cannot run out of process"]),
])
def test_bad_remote_settings_are_refused(params: dict, words: list[str]) -> None:
    with pytest.raises(DefenseConfigError) as err:
        create_defense("remote", params)
    for word in words:
        assert word in str(err.value)


def test_only_update_and_per_example_defenses_can_be_served() -> None:
    with pytest.raises(DefenseConfigError, match="only update and per-example defenses"):
        served_defense("secagg", {})
    assert served_defense("prune", {"p": "0.5"}).name == "prune"
    assert served_defense("dpsgd", {}).stage == "per-example"


def test_the_service_refuses_bad_streams_and_keeps_serving(served) -> None:
    address = served(Clip())
    with grpc.insecure_channel(address) as channel:
        stub = dpb_grpc.DefenseServiceStub(channel)
        bad = [_chunk("w", 0, b"\0" * 4), _chunk("w", 8, b"\0" * 4)]
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Defend(iter(bad)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "send a tensor's chunks in order" in err.value.details()
        ints = update_chunks([torch.arange(3)], ["counts"])
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Defend(ints))
        assert "not floating point" in err.value.details()
        good = assemble_update(stub.Defend(update_chunks([torch.ones(4)], ["w"])))
        assert torch.equal(good.tensors[0], torch.ones(4) * 0.5)
        assert stub.Info(dpb.DefenseInfoRequest()).params["max-norm"] == "1.0"


def test_a_per_example_defense_behind_the_proto_declares_and_privatises(served) -> None:
    """dpsgd served behind the proto: the link is a per-example defense with dpsgd's exact
    declaration, and what the service answers is what dpsgd computes from the same seed."""
    from fedleak.defenses import build_chain
    from fedleak.harness.remote_defense.link import RemotePerExampleDefense

    address = served(create_defense("dpsgd", {"noise-multiplier": "0.8"}))
    link = create_defense("remote", {"address": address, "stage": "per-example"})
    try:
        assert isinstance(link, RemotePerExampleDefense) and link.stage == "per-example"
        local = build_chain([("dpsgd", {"noise-multiplier": "0.8"})]).per_example_mechanism
        assert link.declared() == local
        grads = [torch.randn(5, 3, 2), torch.randn(5, 2)]
        generator = torch.Generator().manual_seed(9)
        got = link.privatise(grads, 4, generator)
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=torch.Generator().manual_seed(9)))
        expected = create_defense("dpsgd", {"noise-multiplier": "0.8"}).privatise(  # type: ignore
            grads, 4, torch.Generator().manual_seed(seed))
        assert [g.shape for g in got] == [torch.Size([3, 2]), torch.Size([2])]
        assert all(torch.allclose(a, b) for a, b in zip(got, expected, strict=True))
    finally:
        link.close()  # type: ignore[attr-defined]


def test_a_stage_mismatch_with_the_service_names_the_fix(served) -> None:
    address = served(create_defense("dpsgd"))
    with pytest.raises(DefenseConfigError, match="stage=per-example"):
        create_defense("remote", {"address": address})


def test_a_per_example_service_refuses_rows_that_disagree(served) -> None:
    address = served(create_defense("dpsgd"))
    with grpc.insecure_channel(address) as channel:
        stub = dpb_grpc.DefenseServiceStub(channel)
        chunks = list(update_chunks([torch.zeros(3, 2), torch.zeros(4)], ["a", "b"], seed=1,
                                    expected_batch_size=3))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Defend(iter(chunks)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "one row per example" in err.value.details()
        missing = list(update_chunks([torch.zeros(3, 2)], ["a"], seed=1))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Defend(iter(missing)))
        assert "expected_batch_size" in err.value.details()
