"""What a new user meets in the first hour, with real processes and real signals: ports in use,
Ctrl-C, a victim that dies mid-attack, privacy spent in the summary, clear CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedleak.harness.cli.main import main
from fedleak.harness.victim.process import VictimProcess

pytestmark = pytest.mark.integration
MLP = ["--dataset", "digits", "--split", "all", "--images", "0-7", "--model",
       "mlp:width=16,depth=1"]


def fedleak(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=timeout)


#: ``python -m fedleak`` with SIGINT's default handler, as in a terminal: a test run started in
#: the background of a non-interactive shell inherits SIGINT ignored, and Python then never
#: raises KeyboardInterrupt (the attacker rightly leaves an ignored SIGINT ignored). Set in the
#: child's first line, not in a ``preexec_fn``: that forces a plain ``fork`` of this pytest
#: worker, whose open gRPC channels can hang or crash the child before it reaches ``exec``.
_WITH_SIGINT = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                "signal.default_int_handler); sys.argv[0] = 'fedleak'; "
                "runpy.run_module('fedleak', run_name='__main__', alter_sys=True)")


def _attacker(address: str, out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _WITH_SIGINT, "attack", "--victim", address,
                             "--quiet", "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition: Callable[[], bool], attacker: subprocess.Popen[str],
              timeout: float = 600) -> None:
    """Wait until ``condition()``; an attacker that exits first, or the timeout, fails the test
    with the attacker's output (killed first on a timeout)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if attacker.poll() is not None or time.monotonic() > deadline:
            how = "was killed after the wait" if attacker.poll() is None else "exited"
            attacker.kill()
            out, err = attacker.communicate(timeout=60)
            raise AssertionError(f"the attacker {how} ({attacker.returncode}) before the "
                                 f"condition held:\n{err[-4000:]}\n{out[-2000:]}")
        time.sleep(0.2)


def test_a_second_server_on_a_port_in_use_is_refused() -> None:
    with VictimProcess(MLP) as first:
        port = first.address.rsplit(":", 1)[1]
        second = fedleak("victim", "serve", *MLP, "--port", port)
        assert second.returncode != 0
        assert f"port {port} is in use" in second.stderr and "--port 0" in second.stderr
        defense = fedleak("defense", "serve", "--defense", "clip:max-norm=1", "--port", port)
        assert defense.returncode != 0 and "--port 0" in defense.stderr
        # localhost is 127.0.0.1 and ::1: the port taken on one of them is taken
        for command in (["victim", "serve", *MLP], ["defense", "serve", "--defense",
                                                    "clip:max-norm=1"]):
            other = fedleak(*command, "--host", "localhost", "--port", port)
            assert other.returncode != 0, other.stdout
            assert f"port {port} is in use on 127.0.0.1" in other.stderr
        assert first.alive()


def test_ctrl_c_keeps_the_finished_rounds_and_exits_130(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.json"
    with VictimProcess(MLP) as victim:
        attacker = _attacker(victim.address, tmp_path, "--rounds", "50", "--iterations", "2000")

        def one_round_done() -> bool:
            return metrics.exists() and len(json.loads(metrics.read_text())["rounds"]) >= 1

        _wait_for(one_round_done, attacker)
        attacker.send_signal(signal.SIGINT)
        _, stderr = attacker.communicate(timeout=1200)
    assert attacker.returncode == 130, stderr
    record = json.loads(metrics.read_text())
    assert record["status"] == "interrupted" and 1 <= len(record["rounds"]) < 50
    assert all(r["mean_psnr"] is not None for r in record["rounds"])
    assert "interrupted" in stderr and "Aborted" not in stderr


def test_a_victim_that_dies_mid_attack_leaves_the_reconstruction(tmp_path: Path) -> None:
    victim = VictimProcess(MLP).start()
    try:
        attacker = _attacker(victim.address, tmp_path, "--iterations", "8000")
        _wait_for(lambda: (tmp_path / "metrics.json").exists(), attacker)  # begun
        time.sleep(1)
        os.kill(victim.pid, signal.SIGKILL)
        _, stderr = attacker.communicate(timeout=1200)
    finally:
        victim.stop()
    assert attacker.returncode == 1
    assert "saved in" in stderr and "unscored" in stderr
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["status"] == "victim gone"
    (entry,) = record["rounds"]
    assert entry["unscored"].startswith("victim gone") and entry["mean_psnr"] is None
    assert (tmp_path / "round-000" / "reconstruction.npy").exists()
    assert (tmp_path / "round-000" / "reconstruction.png").exists()


def test_privacy_spent_is_printed_and_stored_as_numbers(tmp_path: Path) -> None:
    args = [*MLP, "--defense", "dpsgd:noise-multiplier=1.0,max-grad-norm=1.0"]
    with VictimProcess(args) as victim:
        run = fedleak("attack", "--victim", victim.address, "--iterations", "5", "--rounds",
                      "2", "--quiet", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "metrics.json").read_text())
    epsilons = [r["privacy"]["epsilon_total"] for r in record["rounds"]]
    assert all(isinstance(e, float) for e in epsilons) and epsilons[0] < epsilons[1]
    assert record["summary"]["epsilon"] == epsilons[1]
    assert "privacy spent" in run.stdout and "ε" in run.stdout
    assert "1 of 1" in run.stdout  # which image of the round each score line is


def test_cli_errors_come_at_once_and_name_what_to_change() -> None:
    runner = CliRunner()
    no_port = runner.invoke(main, ["attack", "--victim", "localhost", "--iterations", "1"])
    assert no_port.exit_code == 2 and "HOST:PORT" in no_port.output
    listing = runner.invoke(main, ["list"])
    assert "mlp  options: width, depth, bias" in listing.output
    demo_help = runner.invoke(main, ["demo", "--help"])
    assert "higher PSNR" in demo_help.output and "--iterations" in demo_help.output
    assert "Optimisation steps" in demo_help.output


def test_careless_operator_inputs_are_refused_at_start_with_the_reason(tmp_path: Path) -> None:
    """Issue 21's small ones: a garbage checkpoint, a noise scale that overflows, a sweep name
    that would leave runs/ — each refused at once with what to change, no traceback."""
    from fedleak.harness.sweep.grid.spec import SpecError, parse_spec

    runner = CliRunner()
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(b"not a checkpoint\x00\xff" * 10)
    loaded = runner.invoke(main, ["victim", "serve", *MLP, "--checkpoint", str(garbage)])
    assert loaded.exit_code == 2 and "is not a PyTorch state dict" in loaded.output
    assert "Traceback" not in loaded.output
    noisy = runner.invoke(main, ["victim", "serve", *MLP, "--defense", "noise:sigma=1e308"])
    assert noisy.exit_code == 2 and "into infinities; use sigma <= 1e+36" in noisy.output
    spec = (tmp_path / "spec.toml")
    for name in ("../escape", "a/b", "..", "a\\b"):
        spec.write_text(f"[sweep]\nname = {name!r}\n[[sweep.defense]]\nreference = true\n")
        with pytest.raises(SpecError, match="plain name"):
            parse_spec(spec.read_text(), str(spec))


def test_an_attacker_stopped_by_an_error_records_failed(tmp_path: Path) -> None:
    """metrics.json never stays "running" after the attacker exits: here the victim's image
    budget of 1 refuses the second round's score of the same image."""
    one_image = [*MLP[:5], "0", *MLP[6:], "--image-score-budget", "1"]
    with VictimProcess(one_image) as victim:
        attacker = _attacker(victim.address, tmp_path, "--rounds", "2", "--iterations", "2")
        _, stderr = attacker.communicate(timeout=1200)
    assert attacker.returncode == 1 and "--image-score-budget" in stderr
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["status"] == "failed" and len(record["rounds"]) == 1
    assert any("--image-score-budget" in w for w in record["warnings"])


def test_packed_rounds_score_as_separate_ones(tmp_path: Path) -> None:
    """`fedleak attack --pack 3` attacks three rounds as one computation: same figures."""
    figures = {}
    for pack in ("1", "3"):
        with VictimProcess(MLP) as victim:
            run = fedleak("attack", "--victim", victim.address, "--rounds", "3", "--pack", pack,
                          "--restarts", "2", "--iterations", "30", "--quiet", "--out",
                          str(tmp_path / pack))
        assert run.returncode == 0, run.stderr
        record = json.loads((tmp_path / pack / "metrics.json").read_text())
        figures[pack] = [r["mean_psnr"] for r in record["rounds"]]
    assert len(figures["3"]) == 3
    assert figures["3"] == pytest.approx(figures["1"], abs=0.05)
