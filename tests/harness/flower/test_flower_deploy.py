"""examples/flower_deploy.py under stop signals and unfinished reports: SIGTERM (what
``timeout``, CI and ``kill`` send) and SIGHUP stop everything it started, say which phase
each process is in, remove its folder and exit 128 + the signal; a report that is not
``finished`` is said with its reason and exits 3; Flower's ClientApp restart loop is read off
the SuperNodes' logs. The deployments are real: a SuperLink and two SuperNodes on loopback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from tests.paths import REPO  # noqa: E402

SCRIPT = REPO / "examples" / "flower_deploy.py"
MLP = "mlp:width=16,depth=1"
#: a deployment's upper limit at a load average of 20 on 2 cores (a condition's, never a sleep)
DEPLOYMENT_SECONDS = 1500


def deploy_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flower_deploy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marked_processes(token: str) -> list[int]:
    """Processes whose environment carries examples/flower_deploy.py's marker ``token`` (this
    test's own: other deployments on the machine are not this test's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"FEDLEAK_FLOWER_DEPLOY={token}".encode() in (entry / "environ").read_bytes() \
                        .split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def started(tmp_path: Path, run_config: str
            ) -> tuple[subprocess.Popen[str], Path, str]:
    token = uuid.uuid4().hex
    work = tmp_path / "cwd"
    work.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(REPO / "examples" / "flower_app"), "--nodes", "2",
         "--run-config", run_config], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=work, env={**os.environ, "OMP_NUM_THREADS": "1",
                                  "FEDLEAK_FLOWER_DEPLOY": token}, start_new_session=True)
    return process, work, token


def wait_for(condition: object, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + DEPLOYMENT_SECONDS
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the script ended before {what}: {out[-2000:]} {err[-2000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {what} within {DEPLOYMENT_SECONDS} s")


def left_nothing(work: Path, token: str) -> None:
    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    assert marked_processes(token) == []
    assert list(temp.glob(f"fedleak-flower-{token[:12]}-*")) == []  # its folder is gone
    assert list(work.iterdir()) == []


@pytest.mark.integration
def test_sigterm_while_the_audit_attacks_stops_everything_and_the_report_says_so(
        tmp_path: Path) -> None:
    """SIGTERM once the federation is over and the audit's worker attacks: every process it
    started stops (SuperLink, SuperNodes, SuperExecs, flwr run, the ServerApp, the worker),
    the folder goes, exit 143; the lines say each process's phase (the ServerApp's: the
    audit's), and the report written when Flower stopped the ServerApp says ``stopped``."""
    out = tmp_path / "runs"
    process, work, token = started(
        tmp_path, f'out="{out}" options="iterations=1000000 restarts=1" model="{MLP}"')

    def attacking() -> bool:
        try:
            return "queued update(s) after the federation" in json.loads(
                (out / "metrics.json").read_text()).get("phase", "")
        except (OSError, ValueError):
            return False

    wait_for(attacking, process, "the audit attacking after the federation")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM: stopping every process it started" in err
    assert "flower_deploy.py was running the app (flwr run)" in err
    assert "flwr-serverapp (the audit: attacking" in err
    left_nothing(work, token)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "stopped", metrics.get("status_reason")
    assert "queued update(s) after the federation" in metrics["status_reason"]
    assert "says status 'stopped'" in err


@pytest.mark.integration
def test_sighup_while_it_starts_stops_everything(tmp_path: Path) -> None:
    process, work, token = started(tmp_path, f'out="{tmp_path / "runs"}" model="{MLP}"')
    wait_for(lambda: any(b"flower-superlink" in _cmdline(p) for p in marked_processes(token)),
             process, "a SuperLink")
    process.send_signal(signal.SIGHUP)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGHUP, err[-3000:]
    assert "SIGHUP: stopping every process it started" in err
    assert "flower_deploy.py was starting" in err
    left_nothing(work, token)


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_report_that_is_not_finished_is_said_with_its_reason(tmp_path: Path) -> None:
    script = deploy_script()
    assert script.report_problem(None) is None
    assert "wrote no report" in script.report_problem(tmp_path)
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "finished"}))
    assert script.report_problem(tmp_path) is None
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"status": "incomplete", "status_reason": "node-1: did not answer"}))
    assert "'incomplete': node-1: did not answer" in script.report_problem(tmp_path)
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"status": "running", "phase": "the nodes score the attacked updates"}))
    assert "killed?" in script.report_problem(tmp_path)
    assert "the nodes score" in script.report_problem(tmp_path)


def test_the_audits_folder_is_read_as_flwr_run_reads_the_run_config(tmp_path: Path) -> None:
    script = deploy_script()
    app = REPO / "examples" / "flower_app"
    assert script.run_config_out(f'out="{tmp_path}" images=3', app) == tmp_path
    assert script.run_config_out("images=3", app) is None  # the app's own out is relative
    assert script.run_config_out("out='/abs/x' rounds=2", app) == Path("/abs/x")


def test_flowers_restart_loop_is_read_off_a_supernodes_log(tmp_path: Path) -> None:
    script = deploy_script()
    log = ("Receiving: train message (ID: 1)\nStart `flwr-clientapp` process\n"
           "ERROR: Runtime task-token authentication failed.\n"
           "Start `flwr-clientapp` process\nERROR: Runtime task-token authentication failed.\n"
           "Start `flwr-clientapp` process\n")
    (tmp_path / "node0.log").write_text(log)
    (tmp_path / "node1.log").write_text("Receiving: train message (ID: 2)\n"
                                        "Start `flwr-clientapp` process\n")
    (line,) = script.restart_loops(tmp_path, 2)
    assert line.startswith("SuperNode 0: Flower restarted its ClientApp (3 starts for 1 ")
    assert "authentication failed' 2 times" in line
