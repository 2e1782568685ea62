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
from torch._dynamo.utils import counters

from fedleak.attacks import create_attack
from fedleak.attacks.attack_registry import AttackConfigError
from fedleak.attacks.optimisation.engine import compiled
from fedleak.attacks.optimisation.engine.convolutions import (
    NATIVE_MAX_COORDINATES,
    convolution_kernels,
    native_kernels,
)
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation

SHAPE = (3, 8, 8)
#: the DLG LeNet on 8×8: its convolutions through the compiled double backward, small
MODEL = "lenet-zhu"
#: plain Adam (not signed: a sign hides rounding) a few steps: the paths agree to rounding
OPTIONS = {"iterations": 6, "signed": False, "lr": 0.05, "log_every": 2}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def test_a_second_run_loads_the_compiled_step_from_the_cache():
    """The persisted route: after Dynamo's and Inductor's in-memory caches are cleared, as a new
    process would start, a run traces with Dynamo, then finds AOTAutograd's and Inductor's
    entries on disk (no joint graph traced, no code generated) and takes the same steps. The
    same step as the test above, in the same cache folder: one cold compile for the file (it
    runs on one worker), and the first run here saves the entry or, where it was compiled
    before, loads it."""
    from torch._inductor.utils import clear_caches

    target = observation()
    options = {**OPTIONS, "compile": True}
    runs, seen = [], []
    try:
        for _ in range(2):
            torch._dynamo.reset()
            clear_caches()
            counters.clear()
            runs.append(create_attack("inverting-gradients", options).reconstruct(
                target, device="cpu", seed=1))
            seen.append(dict(counters["aot_autograd"]))
    finally:
        torch._dynamo.reset()
        clear_caches()
    first, second = seen
    assert not runs[0].warnings and not runs[1].warnings
    # an inference graph: saved at once (a training graph never was, so every run missed)
    assert first.get("autograd_cache_saved") == 1 or first.get("autograd_cache_hit") == 1, first
    assert second.get("autograd_cache_hit") == 1 and not second.get("autograd_cache_miss"), second
    assert any(compiled.compile_cache_dir().iterdir())
    torch.testing.assert_close(runs[1].images, runs[0].images, rtol=0, atol=0)


def test_a_step_that_cannot_compile_runs_eagerly_with_a_notice(monkeypatch):
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
