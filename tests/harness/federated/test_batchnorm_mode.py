"""The protocol's BatchNorm mode: ``train`` (batch statistics) or ``eval`` (running statistics).

In-process: the eval-mode update is the gradient of the eval-mode network, it leaves the
running statistics where they were, it differs from the train-mode update, and its replay
vectorises over restarts exactly. Across processes: a victim started with ``--batchnorm eval``
publishes the mode and sends that update; the server may ask for either mode per round.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.federated.local_update import UpdateSimulator, local_update
from fedleak.harness.federated.protocol import Protocol, ProtocolError
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model
from fedleak.v1 import victim_pb2 as pb
from tests.conftest import TOKEN

SHAPE = (3, 16, 16)
EVAL = Protocol(batchnorm="eval")


def _convnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("convnet:width=4", SHAPE, 10)


def test_eval_mode_update_is_the_gradient_of_the_eval_network() -> None:
    model = _convnet()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    before = {k: v.clone() for k, v in buffers.items()}
    images, labels = torch.rand(2, *SHAPE), torch.tensor([3, 7])
    got = local_update(model, params, buffers, images, labels, EVAL)
    model.eval()
    loss = torch.nn.functional.cross_entropy(functional_call(model, (params, buffers), images),
                                             labels)
    want = torch.autograd.grad(loss, list(params.values()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    for name, value in buffers.items():  # running statistics are read, never moved
        assert torch.equal(value, before[name]), name
    trained = local_update(model, params, buffers, images, labels, Protocol())
    assert not torch.allclose(trained[0], got[0])


def test_eval_mode_replay_vectorises_exactly() -> None:
    model = _convnet()
    simulator = UpdateSimulator(model, dict(model.named_parameters()),
                                dict(model.named_buffers()), EVAL)
    assert simulator.vectorisable
    # training mode vectorises too: its batch norm is replayed in elementary operations
    assert UpdateSimulator(model, dict(model.named_parameters()),
                           dict(model.named_buffers()), Protocol()).vectorisable
    stacked, labels = torch.randn(3, 1, *SHAPE), torch.tensor([2])
    batched = simulator.restarts(stacked, labels)
    for r in range(3):
        for one, many in zip(simulator(stacked[r], labels), batched, strict=True):
            torch.testing.assert_close(many[r], one, rtol=1e-5, atol=1e-6)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ProtocolError, match="batchnorm"):
        Protocol(batchnorm="frozen")


@pytest.mark.integration
def test_victim_runs_and_publishes_the_mode() -> None:
    args = ["--dataset", "photos", "--split", "all", "--images", "0-1", "--model",
            "convnet:width=4", "--batch-size", "1", "--allow-reveal", "--batchnorm", "eval"]
    with VictimProcess(args, token=TOKEN) as proc, \
            VictimClient(proc.address, token=TOKEN, timeout=60) as client:
        assert client.describe().protocol.batchnorm == "eval"
        params, buffers = client.global_model()
        received = client.compute_update(params, buffers)
        assert received.protocol.batchnorm == "eval"
        truth, labels = client.reveal(received.round_id)
        data = load_dataset("photos", "all")
        model = build_model("convnet:width=4", (3, 32, 32), 10)
        inputs = normalize(truth, data.info)
        want = local_update(model, params, buffers, inputs, labels, EVAL)
        for got, w in zip(received.update, want, strict=True):
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
        asked = client.compute_update(params, buffers, pb.ProtocolSpec(batchnorm="train"))
        assert asked.protocol.batchnorm == "train"
        with pytest.raises(VictimError, match="batchnorm"):
            client.compute_update(params, buffers, pb.ProtocolSpec(batchnorm="sideways"))
        assert client.compute_update(params, buffers).update  # still serving
