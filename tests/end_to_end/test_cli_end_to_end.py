"""End to end, as a person runs it: `fedleak victim serve` and `fedleak attack` as two processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedleak.harness.victim.process import VictimProcess

pytestmark = pytest.mark.e2e
TOKEN = "e2e-token"


def fedleak(*args: str, env_token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if env_token is not None:
        import os

        env = {**os.environ, "FEDLEAK_TOKEN": env_token}
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_attack_a_victim_in_another_process(tmp_path: Path) -> None:
    args = ["--dataset", "photos", "--split", "all", "--images", "0-1", "--model", "lenet-zhu",
            "--allow-reveal"]
    with VictimProcess(args, token=TOKEN) as victim:
        out = tmp_path / "run"
        done = fedleak("attack", "--victim", victim.address, "--attack", "inverting-gradients",
                       "--iterations", "40", "--rounds", "2", "--out", str(out), "--quiet",
                       env_token=TOKEN)
        assert done.returncode == 0, done.stderr
        assert "mean PSNR" in done.stdout and "comparison.png" in done.stdout
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["attack"] == "inverting-gradients" and len(metrics["rounds"]) == 2
        for r in metrics["rounds"]:
            assert r["iterations"] == 40 and r["wall_time_s"] > 0
            assert r["label_accuracy"] == 1.0  # iDLG is exact for one image
            assert 5 < r["mean_psnr"] < 60
            assert (out / r["files"]["comparison"]).stat().st_size > 1000
        assert (out / "round-000" / "reconstruction.npy").exists()

        # restarts split over two worker processes, forked by the attacker after its gRPC
        # channel is open (issue 52): the run ends, and says how many workers ran
        split = tmp_path / "workers"
        done = fedleak("attack", "--victim", victim.address, "--attack", "inverting-gradients",
                       "--iterations", "8", "--restarts", "2", "-o", "workers=2", "--rounds", "1",
                       "--out", str(split), "--quiet", env_token=TOKEN)
        assert done.returncode == 0, done.stderr
        (round0,) = json.loads((split / "metrics.json").read_text())["rounds"]
        # iterations count every restart's: 8 x 2
        assert round0["attack_extras"]["workers"] == 2 and round0["iterations"] == 8 * 2

        bad = fedleak("attack", "--victim", victim.address, "--attack", "no-such-attack")
        assert bad.returncode == 2 and "inverting-gradients" in bad.stderr
        bad = fedleak("attack", "--victim", victim.address, "-o", "no_such_option=1")
        assert bad.returncode == 2 and "valid:" in bad.stderr
    dead = fedleak("attack", "--victim", victim.address, "--iterations", "1")
    assert dead.returncode == 1 and "victim" in dead.stderr


def test_victim_refuses_bad_setup_with_a_usage_error() -> None:
    done = fedleak("victim", "serve", "--dataset", "mnist", "--port", "0")
    assert done.returncode == 2 and "digits" in done.stderr
    done = fedleak("victim", "serve", "--dataset", "cifar10", "--port", "0")
    assert done.returncode == 2 and "--data-root" in done.stderr
    done = fedleak("victim", "serve", "--model", "vgg", "--port", "0")
    assert done.returncode == 2 and "lenet-zhu" in done.stderr


def test_demo_runs_a_victim_and_an_attacker(tmp_path: Path) -> None:
    done = fedleak("demo", "--iterations", "20", "--images", "3", "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert "victim started at 127.0.0.1:" in done.stdout and "mean PSNR" in done.stdout
    assert (tmp_path / "d" / "round-000" / "comparison.png").exists()
