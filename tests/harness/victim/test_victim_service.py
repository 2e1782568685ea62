"""Integration tests against a real victim process: good calls, and bad input answered with the
right status and a clear message while the server keeps serving."""

from __future__ import annotations

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.wire.codec import encode_tensor
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model
from fedleak.v1 import victim_pb2 as pb
from tests.conftest import TOKEN

pytestmark = pytest.mark.integration


def _request(client: VictimClient, **changes: torch.Tensor) -> pb.ComputeUpdateRequest:
    params, buffers = client.global_model()
    params.update(changes)
    return pb.ComputeUpdateRequest(
        parameters=[encode_tensor(t, n) for n, t in params.items()],
        buffers=[encode_tensor(t, n) for n, t in buffers.items()],
    )


def _expect(client: VictimClient, method: str, request: object, code: grpc.StatusCode,
            *words: str, metadata: list | None = None) -> str:
    with pytest.raises(grpc.RpcError) as info:
        getattr(client.stub, method)(request, timeout=30, metadata=metadata)
    assert info.value.code() == code, info.value.details()
    for word in words:
        assert word in info.value.details(), info.value.details()
    return info.value.details()


def _still_serves(client: VictimClient) -> None:
    params, buffers = client.global_model()
    assert client.compute_update(params, buffers).update


def test_describe_publishes_model_data_and_protocol(client: VictimClient) -> None:
    d = client.describe()
    assert d.model.name == "lenet-zhu"
    assert list(d.data.shape) == [3, 32, 32] and d.data.num_classes == 10
    assert len(d.data.mean) == 3 and all(s > 0 for s in d.data.std)
    assert d.protocol.kind == "fedsgd" and d.protocol.num_images == 2
    assert [p.name for p in d.parameters][-1] == "fc.bias"
    assert d.num_private_images == 4 and d.reveal_enabled


def test_update_is_the_users_gradient(client: VictimClient) -> None:
    params, buffers = client.global_model()
    first = client.compute_update(params, buffers)
    assert first.update_kind == "gradient" and first.num_images == 2
    assert first.names == list(params) and "label" not in str(first.metadata).lower()
    truth, labels = client.reveal(first.round_id)
    data = load_dataset("photos", "all")
    assert torch.equal(truth, data.images[:2]) or torch.equal(truth, data.images[2:4])
    model = build_model("lenet-zhu", (3, 32, 32), 10)
    expected = local_update(model, params, buffers, normalize(truth, data.info), labels,
                            Protocol())
    for got, want in zip(first.update, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_fedavg_override_returns_a_delta(client: VictimClient) -> None:
    params, buffers = client.global_model()
    spec = pb.ProtocolSpec(kind="fedavg", local_epochs=2, batch_size=1, learning_rate=0.01)
    got = client.compute_update(params, buffers, spec)
    assert got.update_kind == "delta" and got.local_steps == 4
    assert got.protocol.learning_rate == pytest.approx(0.01)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"fc.bias": torch.zeros(11)}, ["fc.bias", "shape", "[10]"]),
        ({"fc.bias": torch.zeros(10, dtype=torch.float64)}, ["fc.bias", "dtype"]),
        ({"fc.weight": torch.full((10, 768), float("nan"))}, ["fc.weight", "NaN"]),
    ],
)
def test_bad_parameters_are_refused(client: VictimClient, change: dict, words: list) -> None:
    _expect(client, "ComputeUpdate", _request(client, **change),
            grpc.StatusCode.INVALID_ARGUMENT, *words)
    _still_serves(client)


def test_missing_unknown_and_empty_parameters(client: VictimClient) -> None:
    request = _request(client)
    del request.parameters[0]
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "missing")
    request = _request(client)
    request.parameters[0].name = "nonsense"
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "nonsense")
    _expect(client, "ComputeUpdate", pb.ComputeUpdateRequest(),
            grpc.StatusCode.INVALID_ARGUMENT, "no parameters")
    _still_serves(client)


def test_tensor_bytes_that_do_not_fit_the_shape(client: VictimClient) -> None:
    request = _request(client)
    request.parameters[0].data = request.parameters[0].data[:-4]
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "bytes")
    request = _request(client)
    request.parameters[0].dtype = 42
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "dtype")
    _still_serves(client)


def test_bad_protocol_override(client: VictimClient) -> None:
    request = _request(client)
    request.protocol.CopyFrom(pb.ProtocolSpec(kind="fedprox"))
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "fedprox")
    request.protocol.CopyFrom(pb.ProtocolSpec(num_images=7))
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.INVALID_ARGUMENT, "num_images")
    _still_serves(client)


def test_oversized_message_is_refused(client: VictimClient) -> None:
    request = _request(client)
    request.parameters[0].data = bytes(2 << 20)  # 2 MiB against the victim's 1 MiB limit
    _expect(client, "ComputeUpdate", request, grpc.StatusCode.RESOURCE_EXHAUSTED)
    _still_serves(client)


def test_score_matches_and_scores_inside_the_victim(client: VictimClient) -> None:
    params, buffers = client.global_model()
    got = client.compute_update(params, buffers)
    truth, labels = client.reveal(got.round_id)
    perfect = client.score(got.round_id, truth.flip(0), labels.flip(0).tolist())
    assert perfect.mean_psnr > 90 and perfect.label_accuracy == 1.0
    assert sorted(s.matched_index for s in perfect.images) == [0, 1]
    assert perfect.images[0].matched_index == 1  # flipped order is undone by the matching
    _expect(client, "Score", pb.ScoreRequest(round_id=got.round_id,
                                             images=encode_tensor(torch.rand_like(truth))),
            grpc.StatusCode.FAILED_PRECONDITION, "score budget is 1")  # a submission is final
    second = client.compute_update(params, buffers)
    noise = client.score(second.round_id, torch.rand_like(truth))
    assert noise.mean_psnr < 15 and not noise.labels_scored


def test_bad_score_requests(client: VictimClient) -> None:
    params, buffers = client.global_model()
    got = client.compute_update(params, buffers)
    good = encode_tensor(torch.rand(2, 3, 32, 32), "images")
    _expect(client, "Score", pb.ScoreRequest(round_id="feed", images=good),
            grpc.StatusCode.NOT_FOUND, "unknown round id")
    _expect(client, "Score", pb.ScoreRequest(round_id=got.round_id,
                                             images=encode_tensor(torch.rand(3, 3, 32, 32))),
            grpc.StatusCode.INVALID_ARGUMENT, "shape")
    nan = encode_tensor(torch.full((2, 3, 32, 32), float("nan")))
    _expect(client, "Score", pb.ScoreRequest(round_id=got.round_id, images=nan),
            grpc.StatusCode.INVALID_ARGUMENT, "NaN")
    _expect(client, "Score", pb.ScoreRequest(round_id=got.round_id, images=good, labels=[1]),
            grpc.StatusCode.INVALID_ARGUMENT, "labels")
    _expect(client, "Score", pb.ScoreRequest(round_id=got.round_id),
            grpc.StatusCode.INVALID_ARGUMENT, "no images")
    assert client.score(got.round_id, torch.rand(2, 3, 32, 32)).images


def test_reveal_needs_the_token(client: VictimClient) -> None:
    params, buffers = client.global_model()
    got = client.compute_update(params, buffers)
    request = pb.RevealRequest(round_id=got.round_id)
    _expect(client, "Reveal", request, grpc.StatusCode.UNAUTHENTICATED, "token")
    _expect(client, "Reveal", request, grpc.StatusCode.UNAUTHENTICATED, "token",
            metadata=[("x-fedleak-token", "wrong")])
    images, labels = client.reveal(got.round_id)
    assert images.shape == (2, 3, 32, 32) and labels.shape == (2,)
    with pytest.raises(VictimError) as err:
        client.reveal("unknown")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_health_and_reflection(victim_process: VictimProcess) -> None:
    with grpc.insecure_channel(victim_process.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fedleak.v1.Victim"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=60)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=60)))
        names = [s.name for s in reply.list_services_response.service]
        assert "fedleak.v1.Victim" in names


def test_reveal_off_and_graceful_shutdown() -> None:
    proc = VictimProcess(["--dataset", "digits", "--model", "mlp:width=32", "--images", "0-9"],
                         token=TOKEN).start()
    try:
        with VictimClient(proc.address, token=TOKEN, timeout=30) as c:
            params, buffers = c.global_model()
            got = c.compute_update(params, buffers)
            with pytest.raises(VictimError) as err:
                c.reveal(got.round_id)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--allow-reveal" in err.value.details
    finally:
        assert proc.stop() == 0
    assert "stopped" in proc.stderr_tail()


def test_dead_peer_gives_a_clear_error() -> None:
    with VictimClient("127.0.0.1:1", timeout=5) as c, pytest.raises(VictimError) as err:
        c.describe()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "fedleak victim serve" in str(err.value)
