"""Sweeps on a real Ray cluster on loopback: a head and a second node started as separate
processes with ``ray start``, points landing on both, a worker killed mid-point, a driver
killed and resumed. The driver alone writes the store."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import alive, descendants, listening_sockets, tiny_spec

ray = pytest.importorskip("ray", reason="Ray is the optional extra fedleak[ray]")

#: three sweeps of a Ray cluster per test: past pyproject's hang guard at a load average of 20
pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(3600)]
RAY = str(Path(sys.executable).with_name("ray"))
#: Every process of the test cluster shares a fresh token (Ray's token authentication); its
#: workers run at the tests' niceness (``RAY_worker_niceness``, set in conftest.py).
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
TASK_TITLE = "ray::measure_on_node"
#: Deadlines are conditions' upper limits, sized for a load average of 20 on 2 cores (where a
#: sweep that takes a minute alone took ten): a test waits for what it needs, never sleeps on
#: a guess.
SWEEP_SECONDS = 1800
RAY_SECONDS = 600
NOISE = '[[sweep.defense]]\nname = "noise"\nparam = "sigma"\nvalues = [0.01]\n'


def _ray(*args: str) -> None:
    subprocess.run([RAY, *args], check=True, env=ENV, capture_output=True, timeout=RAY_SECONDS)


def _wait_for_nodes(address: str, count: int) -> None:
    """Until the cluster at ``address`` has ``count`` live nodes (a node that `ray start`
    returned for may not have registered yet on a busy machine)."""
    code = ("import ray; from fedleak.harness.sweep.ray_backend import wait_for_nodes; "
            f"ray.init(address={address!r}, logging_level='ERROR'); "
            f"wait_for_nodes({count}, timeout={RAY_SECONDS}, echo=lambda _: None)")
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV, capture_output=True,
                   timeout=RAY_SECONDS + 60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and a second node, one CPU each, as separate processes."""
    if shutil.which(RAY) is None:
        pytest.skip("the ray command is not installed")
    port = 6390 + os.getpid() % 50
    address = f"127.0.0.1:{port}"
    _ray("start", "--head", "--port", str(port), "--num-cpus", "1",
         "--object-store-memory", str(200 << 20), "--include-dashboard", "false",
         "--disable-usage-stats")
    try:
        _ray("start", "--address", address, "--num-cpus", "1",
             "--object-store-memory", str(200 << 20))
        _wait_for_nodes(address, 2)
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True,
                       timeout=RAY_SECONDS)


def _spec(tmp_path: Path, iterations: int, defenses: str = NOISE) -> Path:
    """The tiny spec with the blind attack (cosine, plain replay): every point runs the same
    attack, so points that differ only in their defenses pack whole (the default, ``auto``,
    adds a defense-aware half to defended points, which has nothing to pack with here)."""
    spec = tmp_path / "spec.toml"
    text = tiny_spec(defenses, iterations=iterations, utility_rounds=3)
    blind = f'iterations = {iterations}\nobjective = "cosine"\nreplay = "plain"'
    spec.write_text(text.replace(f"iterations = {iterations}", blind, 1))
    return spec


def _sweep(spec: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "fedleak", "sweep", str(spec), "--out", str(out), "--quiet",
            "--no-report", *args]


def _measurements(out: Path) -> list[tuple[str, str, dict]]:
    """The stored measurements; none while the driver has made the file but not its tables."""
    with sqlite3.connect(out / "results.sqlite") as db:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'measurements'").fetchone() \
                is None:
            return []
        rows = db.execute("SELECT point_id, kind, metrics FROM measurements").fetchall()
    return [(p, k, json.loads(m)) for p, k, m in rows]


def _table(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line[:16].isalnum() and "  done" in line]


def test_points_land_on_both_nodes_and_match_one_machine(cluster: str, tmp_path: Path) -> None:
    spec = _spec(tmp_path, iterations=20)
    on_ray = subprocess.run(_sweep(spec, tmp_path / "ray", "--ray", cluster),
                            capture_output=True, text=True, timeout=SWEEP_SECONDS, env=ENV)
    assert on_ray.returncode == 0, on_ray.stderr
    measured = _measurements(tmp_path / "ray")
    assert sorted(k for _, k, _ in measured) == ["attack", "attack", "utility", "utility"]
    nodes = {m["node"] for _, kind, m in measured if kind == "attack"}
    assert len(nodes) == 2, nodes  # one CPU per node: the two points ran side by side
    assert (tmp_path / "ray" / "points").is_dir()  # the files came back to the driver
    pictures = list((tmp_path / "ray" / "points").rglob("comparison.png"))
    assert len(pictures) == 2
    local = subprocess.run(_sweep(spec, tmp_path / "local", "--threads", "1"),
                           capture_output=True, text=True, timeout=SWEEP_SECONDS, env=ENV)
    assert local.returncode == 0, local.stderr
    assert _table(on_ray.stdout) == _table(local.stdout) and len(_table(local.stdout)) == 2
    packed = subprocess.run(_sweep(spec, tmp_path / "packed", "--ray", cluster,
                                   "--pack-points", "2"),
                            capture_output=True, text=True, timeout=SWEEP_SECONDS, env=ENV)
    assert packed.returncode == 0, packed.stderr
    measured = _measurements(tmp_path / "packed")
    assert len({m["node"] for _, kind, m in measured if kind == "attack"}) == 1  # one task
    runs = list((tmp_path / "packed" / "points").rglob("metrics.json"))
    assert len(runs) == 2 and all(
        [r.get("packed_with") for r in json.loads(run.read_text())["rounds"]] == [2]
        for run in runs)
    local_psnr = {p: m["mean_psnr"] for p, kind, m in _measurements(tmp_path / "local")
                  if kind == "attack"}
    assert {p: m["mean_psnr"] for p, kind, m in measured if kind == "attack"} == \
        pytest.approx(local_psnr, abs=0.05)


def _task_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(TASK_TITLE.encode()):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _kill_task_worker(timeout: float = RAY_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not _task_pids():
        assert time.monotonic() < deadline, "no Ray task started"
        time.sleep(0.2)
    for pid in _task_pids():
        os.kill(pid, signal.SIGKILL)


def test_a_killed_worker_is_retried_then_recorded_failed(cluster: str, tmp_path: Path) -> None:
    spec = _spec(tmp_path, iterations=3000, defenses="")
    retried = subprocess.Popen(_sweep(spec, tmp_path / "retried", "--ray", cluster),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=ENV)
    _kill_task_worker()
    out, err = retried.communicate(timeout=SWEEP_SECONDS)
    assert retried.returncode == 0, err
    (attack,) = [m for _, kind, m in _measurements(tmp_path / "retried") if kind == "attack"]
    assert attack["mean_psnr"] is not None  # measured once, by the retry: never twice
    given_up = subprocess.Popen(_sweep(spec, tmp_path / "given-up", "--ray", cluster,
                                       "--ray-retries", "0"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV)
    _kill_task_worker()
    out, err = given_up.communicate(timeout=SWEEP_SECONDS)
    assert given_up.returncode == 1
    assert "WorkerCrashedError" in err or "WorkerCrashedError" in out
    assert _measurements(tmp_path / "given-up") == []
    with sqlite3.connect(tmp_path / "given-up" / "results.sqlite") as db:
        ((status, error),) = db.execute("SELECT status, error FROM points").fetchall()
    assert status == "failed" and "WorkerCrashedError" in error


def test_a_killed_driver_resumes_without_duplicates(cluster: str, tmp_path: Path) -> None:
    spec = _spec(tmp_path, iterations=20,
                 defenses=NOISE.replace("[0.01]", "[0.01, 0.1]"))
    out = tmp_path / "run"
    driver = subprocess.Popen(_sweep(spec, out, "--ray", cluster), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + SWEEP_SECONDS
    while time.monotonic() < deadline and not (
            (out / "results.sqlite").exists() and _measurements(out)):
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    kept = _measurements(out)
    assert kept, "nothing was recorded before the driver died"
    resumed = subprocess.run(_sweep(spec, out, "--ray", cluster), capture_output=True,
                             text=True, timeout=SWEEP_SECONDS, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    measured = _measurements(out)
    assert [m for m in measured[:len(kept)]] == kept  # what was stored stays untouched
    keys = [(p, k) for p, k, _ in measured]
    assert len(keys) == len(set(keys)) == 6  # 3 points × attack + utility, none twice
    assert not any(alive(pid) for pid in _task_pids())


#: The Ray processes that listen: GCS, raylet and workers (their titles start "ray::").
RAY_SERVERS = ("gcs_server", "raylet", "default_worker.py", "ray::")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_local_cluster_listens_on_loopback_only(tmp_path: Path) -> None:
    """``fedleak sweep --ray`` alone starts a cluster of this machine: its GCS, raylet and
    workers listen on loopback, never on every interface (issue 31)."""
    spec = _spec(tmp_path, iterations=5)
    env = {k: v for k, v in ENV.items() if k != "RAY_ADDRESS"}
    sweep = subprocess.Popen(_sweep(spec, tmp_path / "local", "--ray"), env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict[tuple[int, str, int], str] = {}
    try:
        while sweep.poll() is None:
            for pid, host, port in listening_sockets(descendants(sweep.pid)):
                seen.setdefault((pid, host, port), _cmdline(pid))
            time.sleep(0.3)
        _, err = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 0, err[-3000:]
    servers = {key: line for key, line in seen.items() if any(n in line for n in RAY_SERVERS)}
    assert servers, f"no Ray listener seen: {seen}"
    exposed = {key: line[:120] for key, line in servers.items()
               if not ipaddress.ip_address(key[1]).is_loopback}
    assert not exposed, exposed
