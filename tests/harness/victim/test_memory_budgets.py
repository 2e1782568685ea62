"""What a server can make a victim or a defense service keep is bounded in bytes: secure-
aggregation sessions (``--secagg-memory-mb``), released models (``--release-memory-mb``), one
``Defend`` stream (``--max-update-mb``, and a receive timeout); each refusal is
``RESOURCE_EXHAUSTED`` (or ``DEADLINE_EXCEEDED``) naming its flag."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
import torch

from fedleak.defenses.clip import Clip
from fedleak.harness.remote_defense.defense_server import start_defense_server
from fedleak.harness.remote_defense.wire import update_chunks
from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.settings import VictimSettings, create_victim
from fedleak.harness.wire.request_errors import ResourceExhausted
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc


def _secagg_victim() -> Victim:
    return create_victim(VictimSettings(
        dataset="digits", split="all", images="0-11", model="mlp:width=16,depth=1",
        batch_size=2, users=3, defenses=("secagg:threshold=2",)))


def test_secagg_state_stays_within_its_byte_budget() -> None:
    victim = _secagg_victim()
    params, buffers = victim.global_model()
    first, _ = victim.begin_secagg(params, buffers)
    one_round = first.secagg.nbytes()
    assert one_round == 3 * sum(p.numel() for p in params.values()) * 8
    victim.rounds.secagg_bytes = int(2.5 * one_round)
    later = [victim.begin_secagg(params, buffers)[0]
             for _ in range(4)]
    kept = victim.rounds.secagg_bytes_kept()
    assert kept <= victim.rounds.secagg_bytes
    assert [r.secagg is not None for r in [first, *later]] == [False, False, False, True, True]
    assert first.secagg_forgotten
    with pytest.raises(ResourceExhausted, match="--secagg-memory-mb"):  # a forgotten round
        victim.secagg_step(first.round_id, 0, "advertise-keys", b"")
    assert victim.secagg_step(later[-1].round_id, 0, "advertise-keys", b"")
    victim.rounds.secagg_bytes = one_round - 1
    rounds_before = len(victim.rounds._rounds)
    with pytest.raises(ResourceExhausted, match="--secagg-memory-mb"):  # alone too large
        victim.begin_secagg(params, buffers)
    assert len(victim.rounds._rounds) == rounds_before


def test_a_release_larger_than_its_budget_is_refused_before_training() -> None:
    settings = VictimSettings(dataset="digits", images="0-99", model="kkt-mlp:width=8192,depth=1",
                              limits=VictimLimits(release_memory_mb=1))
    victim = create_victim(settings)
    releaser = victim.releaser
    assert releaser.model_bytes > 1 << 20
    with pytest.raises(ResourceExhausted, match="--release-memory-mb"):
        releaser.release(releaser.training_config(max_epochs=1))


def _stream(chunks: list[dpb.UpdateChunk], pause: threading.Event | None = None) \
        -> Iterator[dpb.UpdateChunk]:
    for i, chunk in enumerate(chunks):
        if pause is not None and i == 1:
            pause.wait(60)
        yield chunk


def test_a_defend_stream_is_capped_in_bytes_and_in_time() -> None:
    # 3 s: a whole 1 MiB stream arrives well within it even at a load average of 20, and the
    # stalled one (paused until its refusal) is refused after it
    server, port = start_defense_server(Clip(), max_update_bytes=4 << 20, receive_timeout=3)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = dpb_grpc.DefenseServiceStub(channel)
            big = list(update_chunks([torch.ones(5 << 18)], ["w"], seed=1))  # 5 MiB
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Defend(iter(big), timeout=30))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-update-mb" in refused.value.details()
            small = list(update_chunks([torch.ones(1 << 18)], ["w"], seed=1,
                                       chunk_bytes=1 << 19))  # 1 MiB in two chunks
            pause = threading.Event()
            with pytest.raises(grpc.RpcError) as stalled:
                list(stub.Defend(_stream(small, pause), timeout=30))
            pause.set()
            assert stalled.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "--receive-timeout" in stalled.value.details()
            answer = list(stub.Defend(iter(small), timeout=30))  # and it keeps serving
            assert sum(len(c.piece.data) for c in answer) == 1 << 20
    finally:
        server.stop(0)
