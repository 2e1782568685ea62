"""Shared fixtures: real victim processes on free loopback ports."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import torch

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.victim.process import VictimProcess

TOKEN = secrets.token_hex(8)


@pytest.fixture(scope="module")
def victim_process() -> Iterator[VictimProcess]:
    """A lenet-zhu victim on the bundled photos, reveal enabled, 1 MiB message limit."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0-3", "--model", "lenet-zhu",
            "--batch-size", "2", "--allow-reveal", "--max-message-mb", "1"]
    with VictimProcess(args, token=TOKEN) as proc:
        yield proc


@pytest.fixture()
def client(victim_process: VictimProcess) -> Iterator[VictimClient]:
    with VictimClient(victim_process.address, token=TOKEN, max_message_bytes=64 << 20,
                      timeout=60) as c:
        yield c


@pytest.fixture()
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors: one thread is as fast, and immune to OpenMP barriers on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Files whose tests start or attach to a Ray cluster (Flower's simulation backend attaches to a
# running one): under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) they share one
# worker, so no two of them ever run at once.
_ONE_RAY_CLUSTER = {"test_flower.py", "test_sweep_ray.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _ONE_RAY_CLUSTER or item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray-cluster"))
