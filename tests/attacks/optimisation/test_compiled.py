"""The compiled objective step and the convolution kernels: the eager engine's numbers.

One small compile (LeNet on one 3×8×8 image; Inductor's cache in the fedleak cache dir makes a
re-run retrace only), loaded back from that cache as a later process would; the fallback and
the kernel rule need no compiler.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.attack_registry import AttackConfigError
from fedleak.attacks.optimisation.engine import compiled
from fedleak.attacks.optimisation.engine.convolutions import (
    NATIVE_MAX_COORDINATES,
    convolution_kernels,
    native_kernels,
)
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation, torch_threads

SHAPE = (3, 8, 8)
#: the DLG LeNet on 8×8: its convolutions through the compiled double backward, small
MODEL = "lenet-zhu"
#: plain Adam (not signed: a sign hides rounding) a few steps: the paths agree to rounding
OPTIONS = {"iterations": 6, "signed": False, "lr": 0.05, "log_every": 2}


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def observation():
    return make_observation(MODEL, SHAPE, 10, smooth_image(SHAPE), torch.tensor([3]))


def test_compiled_step_gives_the_eager_result():
    target = observation()
    eager = create_attack("inverting-gradients", OPTIONS).reconstruct(
        target, device="cpu", seed=1)
    fast = create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        target, device="cpu", seed=1)
    assert not fast.warnings  # it compiled: no fallback notice
    torch.testing.assert_close(fast.images, eager.images, rtol=1e-4, atol=1e-5)
    assert fast.objective == pytest.approx(eager.objective, rel=1e-4, abs=1e-6)


def _spy_on_the_saved_steps(monkeypatch):
    """Record each load (found or not) and each precompile of the compiled step."""
    loads, traces = [], []
    real_load, real_precompile = compiled.load_step, compiled.precompile

    def load(path, closure):
        found = real_load(path, closure)
        loads.append(found is not None)
        return found

    def precompile(*args, **kwargs):
        traces.append(1)
        return real_precompile(*args, **kwargs)

    monkeypatch.setattr(compiled, "load_step", load)
    monkeypatch.setattr(compiled, "precompile", precompile)
    return loads, traces


def _as_a_new_process():
    """Clear Dynamo's and Inductor's in-memory caches, as a new process starts."""
    from torch._inductor.utils import clear_caches

    torch._dynamo.reset()
    clear_caches()


def test_a_second_run_loads_the_saved_step_and_traces_nothing(monkeypatch):
    """The persisted route: after the in-memory caches are cleared, as a new process would
    start, a run finds the step saved under its key (precompiled by the first run, or by an
    earlier test process) and loads it: Dynamo traces nothing, and the steps are the same bit
    for bit."""
    loads, traces = _spy_on_the_saved_steps(monkeypatch)
    target = observation()
    options = {**OPTIONS, "compile": True}
    runs = []
    try:
        for _ in range(2):
            _as_a_new_process()
            before = len(traces)
            runs.append(create_attack("inverting-gradients", options).reconstruct(
                target, device="cpu", seed=1))
        assert len(traces) == before  # the second run traced nothing
    finally:
        _as_a_new_process()
    assert not runs[0].warnings and not runs[1].warnings
    assert loads[-1] is True
    assert list((compiled.compile_cache_dir() / "steps").glob("*.bin"))
    torch.testing.assert_close(runs[1].images, runs[0].images, rtol=0, atol=0)


def test_a_saved_step_serves_another_model_of_the_same_structure(monkeypatch):
    """The saved step holds no weights and no data: a LeNet with other weights, another image
    and label load the same file and get that problem's own eager result."""
    loads, traces = _spy_on_the_saved_steps(monkeypatch)
    first = observation()
    other = make_observation(MODEL, SHAPE, 10, smooth_image(SHAPE).flip(-1), torch.tensor([7]),
                             seed=5)
    options = {**OPTIONS, "compile": True}
    try:
        _as_a_new_process()
        create_attack("inverting-gradients", options).reconstruct(first, device="cpu", seed=1)
        _as_a_new_process()
        before = len(traces)
        fast = create_attack("inverting-gradients", options).reconstruct(other, device="cpu",
                                                                         seed=1)
        assert len(traces) == before and loads[-1] is True  # loaded, not traced
    finally:
        _as_a_new_process()
    eager = create_attack("inverting-gradients", OPTIONS).reconstruct(other, device="cpu", seed=1)
    torch.testing.assert_close(fast.images, eager.images, rtol=1e-4, atol=1e-5)
    assert fast.objective == pytest.approx(eager.objective, rel=1e-4, abs=1e-6)


def test_a_broken_saved_step_is_traced_again(monkeypatch, tmp_path):
    """A file that does not load (truncated, another torch's) is a cache miss: removed, the step
    traced and saved anew, the result the eager one."""
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))
    loads, traces = _spy_on_the_saved_steps(monkeypatch)
    target = observation()
    options = {**OPTIONS, "compile": True}
    try:
        _as_a_new_process()
        create_attack("inverting-gradients", options).reconstruct(target, device="cpu", seed=1)
        (saved,) = (tmp_path / "inductor" / "steps").glob("*.bin")
        saved.write_bytes(saved.read_bytes()[:1000])
        _as_a_new_process()
        before = len(traces)
        fast = create_attack("inverting-gradients", options).reconstruct(target, device="cpu",
                                                                         seed=1)
        assert loads[-1] is False and len(traces) == before + 1
    finally:
        _as_a_new_process()
    assert not fast.warnings
    assert saved.stat().st_size > 1000  # saved anew
    eager = create_attack("inverting-gradients", OPTIONS).reconstruct(target, device="cpu",
                                                                      seed=1)
    torch.testing.assert_close(fast.images, eager.images, rtol=1e-4, atol=1e-5)


def test_a_step_that_cannot_compile_runs_eagerly_with_a_notice(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))  # no step saved by another test

    def broken(function, **options):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(compiled.torch, "compile", broken)
    target = observation()
    eager = create_attack("inverting-gradients", OPTIONS).reconstruct(
        target, device="cpu", seed=1)
    fallback = create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        target, device="cpu", seed=1)
    assert any("compile failed (RuntimeError: no C++ compiler)" in w for w in fallback.warnings)
    # the eager fallback is the functional (vmap) replay: the same maths, other rounding
    torch.testing.assert_close(fallback.images, eager.images, rtol=1e-4, atol=1e-5)


def test_native_kernels_for_one_small_image_of_a_small_model():
    one = torch.zeros(1, 1, 3, 32, 32)
    assert native_kernels("auto", one, 60_000)
    assert native_kernels("auto", torch.zeros(8, 1, 3, 32, 32), 60_000)  # per restart
    assert not native_kernels("auto", torch.zeros(1, 8, 3, 32, 32), 60_000)
    assert not native_kernels("auto", one, NATIVE_MAX_COORDINATES + 1)
    assert native_kernels("native", torch.zeros(1, 8, 3, 224, 224), 10**8)
    assert not native_kernels("onednn", one, 1)
    with pytest.raises(ValueError, match="convolutions must be one of"):
        native_kernels("im2col", one, 1)


def test_kernels_are_restored_and_a_bad_choice_is_refused():
    before = torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()
    with convolution_kernels(True):
        assert not torch._C._get_mkldnn_enabled()
    assert torch._C._get_mkldnn_enabled() == before
    with pytest.raises(AttackConfigError, match="convolutions must be one of auto, onednn"):
        create_attack("inverting-gradients", {"convolutions": "fast"})


def test_the_compile_cache_is_in_fedleaks_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDLEAK_CACHE_DIR", raising=False)
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path / "a"))
    assert compiled.compile_cache_dir() == tmp_path / "a" / "inductor"
    monkeypatch.delenv("FEDLEAK_CACHE")
    monkeypatch.setenv("FEDLEAK_CACHE_DIR", str(tmp_path / "b"))  # the older name
    assert compiled.compile_cache_dir() == tmp_path / "b" / "inductor"


def test_the_cache_folder_wins_over_torchs_default_but_not_over_the_users(monkeypatch, tmp_path):
    """Importing Dynamo writes torch's default folder into TORCHINDUCTOR_CACHE_DIR (this
    module imported it): that is not the user's choice; a folder the user names is."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path / "fedleak"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    compiled.use_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "fedleak" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compiled.use_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_the_guards_are_skipped_in_the_loop_only_where_the_problem_never_revises(monkeypatch):
    """After the first, compiling call nothing a guard sees changes, unless the problem revises
    its replay during the loop (a modelled visiting order): then every guard is checked."""
    stances = []
    real = torch.compiler.set_stance

    def spy(*args, **kwargs):
        stances.append(kwargs.get("skip_guard_eval_unsafe"))
        return real(*args, **kwargs)

    monkeypatch.setattr(compiled.torch.compiler, "set_stance", spy)
    assert isinstance(compiled._guards_checked_once(False), contextlib.nullcontext)
    assert stances == []
    target = observation()
    create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        target, device="cpu", seed=1)
    assert stances == [True]


def test_a_problem_that_revises_its_replay_takes_the_jit_route(monkeypatch):
    """A modelled visiting order revises the replay between iterations: a guard must see it,
    so such a problem is never loaded from (or saved to) a file without its guards."""
    import dataclasses

    seen = {}
    real = compiled.compiled_gradient

    def capture(problem, terms, images, weights, *, unfold=False):
        seen.update(problem=problem, terms=terms, images=images.detach().clone(),
                    weights=weights)
        return real(problem, terms, images, weights, unfold=unfold)

    monkeypatch.setattr(compiled, "compiled_gradient", capture)
    create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        observation(), device="cpu", seed=1)
    revising = dataclasses.replace(seen["problem"], revise=lambda images: None, revise_at=(3,))
    loads, traces = _spy_on_the_saved_steps(monkeypatch)
    images, terms, weights = seen["images"], seen["terms"], seen["weights"]
    try:
        step = compiled._compiled_step(revising, terms, images, weights, {}, False)
        grad, value = step(images, weights)
    finally:
        _as_a_new_process()
    assert loads == [] and traces == []
    want_grad, want_value = revising.value_and_gradient(images.clone().requires_grad_(True),
                                                        terms, weights)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(value, want_value.detach(), rtol=1e-4, atol=1e-6)


def test_a_step_that_failed_to_compile_is_not_compiled_again(monkeypatch, tmp_path):
    """Where both routes fail (here: no compiler at all), the key is remembered per Inductor
    wrapper, and a later process runs eagerly at once, with a notice that says so."""
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))
    calls = []

    def broken(function, **options):
        calls.append(options)

        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(compiled.torch, "compile", broken)
    target = observation()
    first = create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        target, device="cpu", seed=1)
    assert any("no C++ compiler" in w for w in first.warnings)
    assert len(list((tmp_path / "inductor" / "steps").glob("*.failed"))) == 2  # both wrappers
    compiling = len(calls)
    again = create_attack("inverting-gradients", {**OPTIONS, "compile": True}).reconstruct(
        target, device="cpu", seed=1)
    assert len(calls) == compiling  # nothing compiled
    assert any("failed before on this machine: RuntimeError: no C++ compiler" in w
               for w in again.warnings)
    torch.testing.assert_close(again.images, first.images, rtol=0, atol=0)


def test_a_saved_step_that_does_not_run_takes_the_jit_route(monkeypatch, tmp_path):
    """A file that loads and passes its guards but fails on its first call is removed, and the
    step is traced by the JIT route in the same run: no failure is remembered, the result is
    the eager one."""
    monkeypatch.setenv("FEDLEAK_CACHE", str(tmp_path))
    target = observation()
    options = {**OPTIONS, "compile": True}

    class Broken:
        def guard_check(self, *args):
            return True

        def __call__(self, *args):
            raise RuntimeError("a stale saved step")

    try:
        _as_a_new_process()
        create_attack("inverting-gradients", options).reconstruct(target, device="cpu", seed=1)
        monkeypatch.setattr(compiled, "load_step", lambda path, closure: Broken())
        _as_a_new_process()
        fast = create_attack("inverting-gradients", options).reconstruct(target, device="cpu",
                                                                         seed=1)
    finally:
        _as_a_new_process()
    steps = tmp_path / "inductor" / "steps"
    assert not fast.warnings
    assert not list(steps.glob("*.failed")) and not list(steps.glob("*.bin"))  # removed
    eager = create_attack("inverting-gradients", OPTIONS).reconstruct(target, device="cpu",
                                                                      seed=1)
    torch.testing.assert_close(fast.images, eager.images, rtol=1e-4, atol=1e-5)
