"""Secure aggregation across processes: the attacker runs the server side over gRPC against a
victim holding several users, some of which drop out mid-protocol."""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
import torch

from fedleak.defenses.secagg import SecAggAbort
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.secagg_rounds import as_received_update, run_secagg
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings, create_victim
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.integration
TOKEN = "secagg-token"
MODEL = "mlp:width=16,depth=1"
ARGS = ["--dataset", "digits", "--split", "all", "--images", "0-19", "--model", MODEL,
        "--batch-size", "2", "--users", "5", "--allow-reveal"]


def _clean_user_updates(client: VictimClient, round_id: str, params: dict, buffers: dict,
                        users: int, per_user: int) -> list[np.ndarray]:
    truth, labels = client.reveal(round_id)
    info = load_dataset("digits", "all").info
    model = build_model(MODEL, (1, 8, 8), 10)
    out = []
    for u in range(users):
        part = slice(u * per_user, (u + 1) * per_user)
        update = local_update(model, params, buffers, normalize(truth[part], info),
                              labels[part], Protocol())
        out.append(torch.cat([t.flatten() for t in update]).double().numpy())
    return out


def test_survivors_sum_is_recovered_after_dropouts() -> None:
    args = [*ARGS, "--defense", "secagg:threshold=3,clip=10", "--secagg-drop", "3@share-keys",
            "--secagg-drop", "4@masked-input"]
    with VictimProcess(args, token=TOKEN) as victim, VictimClient(victim.address,
                                                                  token=TOKEN) as client:
        described = client.describe()
        assert described.num_users == 5
        assert [(d.name, d.stage) for d in described.defenses] == [("secagg", "transport")]
        params, buffers = client.global_model()
        with pytest.raises(VictimError) as err:
            client.compute_update(params, buffers)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        aggregation = run_secagg(client, params, buffers)
        assert aggregation.offline == {3: "share-keys", 4: "masked-input"}
        assert aggregation.result.survivors == (0, 1, 2)
        assert aggregation.transcript.u2 == (0, 1, 2, 4)
        clean = _clean_user_updates(client, aggregation.begin.round_id, params, buffers, 5, 2)
        expected = clean[0] + clean[1] + clean[2]
        bound = 3 * 10 / (2 ** 32 // 5) * 1.01  # K/(2s) with s = floor((2^32-1)/K)/(2c)
        assert np.abs(aggregation.result.total - expected).max() <= bound
        masked = aggregation.transcript.masked_update(0)
        assert np.abs(masked - clean[0]).mean() > 1.0  # one masked vector is noise
        received = as_received_update(aggregation, list(params),
                                      [tuple(t.shape) for t in params.values()])
        assert received.num_images == 6 and received.user_ids == [0, 1, 2]
        score = client.score(received.round_id, torch.rand(6, 1, 8, 8), user_ids=[0, 1, 2])
        assert len(score.images) == 6


def test_too_many_dropouts_abort() -> None:
    args = [*ARGS, "--defense", "secagg:threshold=3,clip=10", "--secagg-drop", "0@masked-input",
            "--secagg-drop", "1@masked-input", "--secagg-drop", "2@unmasking"]
    with VictimProcess(args, token=TOKEN) as victim, VictimClient(victim.address,
                                                                  token=TOKEN) as client:
        params, buffers = client.global_model()
        with pytest.raises(SecAggAbort):
            run_secagg(client, params, buffers)
        assert client.describe().num_users == 5  # still serving


def test_users_without_secagg_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "fedleak", "victim", "serve", "--port", "0",
                           "--users", "3"], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 2 and "secagg" in done.stderr


def test_parameters_that_make_training_diverge_are_refused_up_front(
        one_torch_thread: None) -> None:
    """θ of 1e38 overflows local training: BeginSecAgg refuses it with FAILED_PRECONDITION
    ("training diverged"), as ComputeUpdate does, and opens no round — it used to answer OK
    and fail later as a user's unreadable message."""
    victim = create_victim(VictimSettings(dataset="digits", split="all", images="0-11",
                                          model=MODEL, batch_size=2, users=3,
                                          defenses=("secagg:threshold=2",)))
    params, buffers = victim.global_model()
    huge = {name: torch.full_like(value, 1e38) for name, value in params.items()}
    with pytest.raises(FailedPrecondition, match="training diverged"):
        victim.begin_secagg(huge, buffers)
    assert victim.rounds.secagg_bytes_kept() == 0
    round_, _ = victim.begin_secagg(params, buffers)  # sound parameters still open a round
    assert round_.secagg is not None
