"""One intra-op thread for one small image: the rule, the restore, and the loop that runs so."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks.optimisation.engine import first_order
from fedleak.attacks.optimisation.engine.convolutions import NATIVE_MAX_COORDINATES
from fedleak.attacks.optimisation.engine.intra_op_threads import intra_op_threads, single_thread
from tests.helpers import torch_threads


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


def test_one_small_image_of_a_small_model_runs_on_one_thread():
    assert single_thread(torch.zeros(1, 1, 3, 32, 32), 60_000)
    assert single_thread(torch.zeros(1, 1, 1, 8, 8), 0)  # size of the update not known
    assert not single_thread(torch.zeros(2, 1, 3, 32, 32), 60_000)  # two restarts
    assert not single_thread(torch.zeros(1, 2, 3, 32, 32), 60_000)  # two images
    assert not single_thread(torch.zeros(1, 1, 3, 64, 64), 60_000)
    assert not single_thread(torch.zeros(1, 1, 3, 32, 32), NATIVE_MAX_COORDINATES + 1)
    assert not single_thread(torch.zeros(1, 1, 3, 32, 32, device="meta"), 60_000)


def test_the_callers_threads_come_back(two_threads):
    with intra_op_threads(True):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), intra_op_threads(True):
        raise RuntimeError("the loop failed")
    assert torch.get_num_threads() == 2
    with intra_op_threads(False):
        assert torch.get_num_threads() == 2


def test_the_first_order_loop_of_one_small_image_runs_on_one_thread(two_threads, monkeypatch):
    seen = []

    def loop(problem, images, span, gradient=None):
        seen.append(torch.get_num_threads())
        return images

    monkeypatch.setattr(first_order, "optimise_eager", loop)
    problem = type("Problem", (), {"coordinates": 60_000, "rows": True})()
    for images in (torch.zeros(1, 1, 3, 32, 32), torch.zeros(4, 1, 3, 32, 32)):
        first_order.optimise_first_order(problem, images, None, graph_safe=False,
                                         compiled=False, kernels="auto")
    assert seen == [1, 2]
    assert torch.get_num_threads() == 2
