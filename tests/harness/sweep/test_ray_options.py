"""How ``fedleak sweep --ray`` starts Ray, without starting it: a cluster of this machine alone
listens on loopback. (``tests/harness/sweep/test_sweep_ray.py`` checks the listeners of a real local
cluster.)"""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from fedleak.harness.sweep import ray_backend
from fedleak.harness.sweep.ray_backend import RayOptions, connect, init_options
from tests.helpers import descendants, listening_sockets


def test_a_local_cluster_is_started_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = init_options(RayOptions())
    assert local["address"] == "local" and local["include_dashboard"] is False
    assert local["_node_ip_address"] == "127.0.0.1" and local["dashboard_host"] == "127.0.0.1"
    for joined in (init_options(RayOptions(address="auto")),
                   init_options(RayOptions(address="10.0.0.1:6379"))):
        assert "_node_ip_address" not in joined and "dashboard_host" not in joined
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # ray.init would join that cluster
    assert "_node_ip_address" not in init_options(RayOptions())


def test_connect_keeps_ray_from_taking_the_routable_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray.init`` turns 127.0.0.1 into the machine's routable address unless Ray's cluster
    switch is off; connect turns it off in Ray and in the processes Ray starts."""
    calls: list[dict[str, Any]] = []
    constants = SimpleNamespace(ENABLE_RAY_CLUSTER=True)
    fake = SimpleNamespace(is_initialized=lambda: False,
                           init=lambda **kwargs: calls.append(kwargs),
                           _private=SimpleNamespace(ray_constants=constants))
    monkeypatch.setattr(ray_backend, "import_ray", lambda: fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")  # restored afterwards
    assert connect(RayOptions()) is fake
    assert calls == [init_options(RayOptions())]
    assert constants.ENABLE_RAY_CLUSTER is False
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"

    calls.clear()
    constants.ENABLE_RAY_CLUSTER = True
    connect(RayOptions(address="auto"))  # joining a cluster changes nothing of Ray's
    assert calls == [init_options(RayOptions(address="auto"))]
    assert constants.ENABLE_RAY_CLUSTER is True


def test_listening_sockets_are_found_per_process() -> None:
    with socket.socket() as loopback, socket.socket() as everywhere:
        loopback.bind(("127.0.0.1", 0))
        everywhere.bind(("0.0.0.0", 0))
        for sock in (loopback, everywhere):
            sock.listen()
        found = {(host, port) for pid, host, port in listening_sockets(descendants(os.getpid()))
                 if pid == os.getpid()}
        assert ("127.0.0.1", loopback.getsockname()[1]) in found
        assert ("0.0.0.0", everywhere.getsockname()[1]) in found
