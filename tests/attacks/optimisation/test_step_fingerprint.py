"""The key of a saved compiled step: what decides the graph changes it, tensor values do not."""

from __future__ import annotations

import dataclasses
import threading

import torch

from fedleak.attacks.optimisation.engine import step_fingerprint as fingerprint
from fedleak.attacks.optimisation.engine.step_fingerprint import step_fingerprint

#: a module-level setting that the code below reads: a global the key must see
SCALE = 2.0


@dataclasses.dataclass(frozen=True)
class Objective:
    power: float
    weights: torch.Tensor


def _replay(layer: torch.nn.Module):
    def replay(x: torch.Tensor) -> torch.Tensor:
        return layer(x) * SCALE
    return replay


def _key(layer=None, power=2.0, weights=None, example=None, options=None):
    torch.manual_seed(0)
    layer = layer if layer is not None else torch.nn.Linear(4, 3)
    weights = weights if weights is not None else torch.ones(3)
    example = example if example is not None else torch.zeros(2, 4)
    return step_fingerprint([_replay(layer), Objective(power, weights), (example,)],
                            options or {"cpp_wrapper": True})


def test_the_same_structure_with_other_values_has_the_same_key():
    torch.manual_seed(1)
    other = torch.nn.Linear(4, 3)  # other weights
    assert _key() == _key()
    assert _key(layer=other, weights=torch.rand(3), example=torch.rand(2, 4)) == _key()


def test_what_decides_the_graph_changes_the_key(monkeypatch):
    base = _key()
    assert _key(power=3.0) != base  # a Python number is a constant of the graph
    assert _key(layer=torch.nn.Linear(4, 3, bias=False)) != base  # another module
    assert _key(example=torch.zeros(3, 4)) != base  # another shape
    assert _key(example=torch.zeros(2, 4, dtype=torch.float64)) != base
    assert _key(example=torch.zeros(4, 2).t()) != base  # another stride
    assert _key(options={"cpp_wrapper": False}) != base
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # Inductor's loops are written for a thread count
        assert _key() != base
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    assert _key() != base  # a global the replay's code reads


def test_other_code_changes_the_key(monkeypatch):
    def replay(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    def other(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + 1.0

    base = step_fingerprint([replay], {})
    assert base != step_fingerprint([other], {})
    monkeypatch.setattr(fingerprint, "fedleak_source_digest", lambda: "edited")
    assert step_fingerprint([replay], {}) != base  # a fedleak module edited


def test_an_object_the_walk_cannot_read_gives_no_key():
    assert step_fingerprint([{"lock": threading.Lock()}], {}) is None


def test_too_many_objects_give_no_key(monkeypatch):
    monkeypatch.setattr(fingerprint, "MAX_OBJECTS", 10)
    assert step_fingerprint([[[i] for i in range(20)]], {}) is None
    assert step_fingerprint([[1, 2, 3]], {}) is not None


def test_shared_objects_and_cycles_are_walked_once():
    loop: list[object] = []
    loop.append(loop)
    shared = [1.0]
    assert step_fingerprint([loop], {}) is not None
    assert step_fingerprint([[shared, shared]], {}) != step_fingerprint([[shared, [1.0]]], {})


def _net(shifted: bool) -> type[torch.nn.Module]:
    """The same class name twice, with another ``forward``: a user's model file edited."""
    if shifted:
        class Net(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x + 1.0
    else:
        class Net(torch.nn.Module):  # type: ignore[no-redef]
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 1.0
    return Net


def test_a_users_model_with_another_forward_has_another_key():
    plain, shifted = _net(False)(), _net(True)()
    assert type(plain).__qualname__ == type(shifted).__qualname__
    assert step_fingerprint([plain], {}) != step_fingerprint([shifted], {})
    assert step_fingerprint([plain], {}) == step_fingerprint([_net(False)()], {})


def test_global_settings_that_change_a_trace_change_the_key():
    base = step_fingerprint([torch.zeros(2)], {})
    enabled = torch._C._get_mkldnn_enabled()
    try:
        torch._C._set_mkldnn_enabled(not enabled)
        assert step_fingerprint([torch.zeros(2)], {}) != base
    finally:
        torch._C._set_mkldnn_enabled(enabled)
    assert step_fingerprint([torch.zeros(2)], {}) == base


def test_libraries_are_named_and_fedleak_and_users_code_walked():
    assert fingerprint._is_library("torch.nn.functional")
    assert fingerprint._is_library("numpy.linalg") and fingerprint._is_library("collections")
    assert not fingerprint._is_library("fedleak.attacks.optimisation.priors")
    assert not fingerprint._is_library("tests.helpers")
    assert fingerprint._is_users("tests.helpers") and not fingerprint._is_users("fedleak.flower")
