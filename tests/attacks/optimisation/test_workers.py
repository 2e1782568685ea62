"""Restarts in worker processes: the same seed gives what one process gives."""

from __future__ import annotations

import os
import pickle
import sys
import types

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.optimisation.engine import workers
from fedleak.attacks.optimisation.engine.workers import WorkerError, chunks
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation

SHAPE = (3, 8, 8)
OPTIONS = {"iterations": 6, "restarts": 3, "log_every": 3}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def observation():
    return make_observation("lenet-zhu", SHAPE, 10, smooth_image(SHAPE), torch.tensor([3]))


def test_chunks_cover_the_restarts_in_order():
    assert chunks(8, 2) == [(0, 4), (4, 4)]
    assert chunks(3, 2) == [(0, 2), (2, 1)]
    assert chunks(2, 5) == [(0, 1), (1, 1)]


@pytest.mark.parametrize("vectorised", [True, False])
def test_two_workers_give_the_one_process_result(vectorised: bool):
    target = observation()
    options = {**OPTIONS, "vectorised": vectorised}
    one = create_attack("inverting-gradients", options).reconstruct(target, seed=5)
    two = create_attack("inverting-gradients", {**options, "workers": 2}) \
        .reconstruct(target, seed=5)
    assert two.extras["workers"] == 2
    assert "workers" not in one.extras
    torch.testing.assert_close(torch.tensor(two.restart_objectives),
                               torch.tensor(one.restart_objectives), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(two.images, one.images, rtol=1e-4, atol=1e-5)
    assert two.objective == pytest.approx(one.objective, rel=1e-4)
    assert two.iterations == one.iterations


def die(index: int):
    os._exit(3)


class Exit:
    """Unpickled in a fork server's worker, it kills that worker."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_dead_forked_worker_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(workers, "start_method", lambda payload: "fork")
    monkeypatch.setattr(workers, "run_chunk", die)
    attack = create_attack("inverting-gradients", {**OPTIONS, "workers": 2})
    with pytest.raises(WorkerError, match="died"):
        attack.reconstruct(observation(), seed=0)


def test_a_dead_fork_server_worker_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(workers, "pickled_job", lambda job: pickle.dumps(Exit()))
    attack = create_attack("inverting-gradients", {**OPTIONS, "workers": 2})
    with pytest.raises(WorkerError, match="died"):
        attack.reconstruct(observation(), seed=0)


def test_the_job_goes_to_a_fork_server_and_an_unpicklable_one_beside_grpc_stays_home(
        monkeypatch: pytest.MonkeyPatch):
    assert workers.start_method(b"job") == "forkserver"
    monkeypatch.setitem(sys.modules, "grpc", sys.modules.get("grpc", types.ModuleType("grpc")))
    assert workers.start_method(None) is None
    monkeypatch.setattr(workers, "pickled_job", lambda job: None)
    target = observation()
    alone = create_attack("inverting-gradients", {**OPTIONS, "workers": 2}) \
        .reconstruct(target, seed=5)
    one = create_attack("inverting-gradients", OPTIONS).reconstruct(target, seed=5)
    assert "workers" not in alone.extras
    assert any("ran in one process" in w for w in alone.warnings)
    torch.testing.assert_close(alone.images, one.images)
    monkeypatch.delitem(sys.modules, "grpc")
    assert workers.start_method(None) == "fork"


def test_workers_below_one_are_refused():
    with pytest.raises(Exception, match="workers"):
        create_attack("inverting-gradients", {**OPTIONS, "workers": 0})
