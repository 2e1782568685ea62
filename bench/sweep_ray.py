"""Points per minute of a sweep on a Ray cluster of one and of two local nodes.

Starts a Ray head (and a second node) on loopback with ``ray start`` — one CPU each, as
separate processes — runs ``fedleak sweep --preset quick --ray ADDRESS`` from scratch, prints
the wall time and points per minute, checks that the summary table equals the one of a sweep
without Ray (``--table-from RUN`` compares with a run you made), and stops the cluster.

    .venv/bin/python bench/sweep_ray.py                  # 1 node, then 2 nodes
    .venv/bin/python bench/sweep_ray.py --nodes 2 --preset quick
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
       "RAY_AUTH_TOKEN": secrets.token_hex(32), "OMP_NUM_THREADS": "1"}


def table(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line[:16].isalnum() and "  done" in line]


def sweep(preset: str, out: Path, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "fedleak", "sweep", "--preset", preset,
                          "--out", str(out), "--quiet", "--no-report", *args],
                         capture_output=True, text=True, env=ENV, check=True)
    return time.perf_counter() - started, run.stdout


def on_cluster(nodes: int, preset: str, out: Path) -> tuple[float, str]:
    port = 6380 + nodes
    address = f"127.0.0.1:{port}"
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--num-cpus", "1",
                    "--include-dashboard", "false", "--disable-usage-stats"], env=ENV,
                   check=True, capture_output=True)
    try:
        for _ in range(nodes - 1):
            subprocess.run([RAY, "start", "--address", address, "--num-cpus", "1"], env=ENV,
                           check=True, capture_output=True)
        return sweep(preset, out, "--ray", address)
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True)


@click.command()
@click.option("--preset", default="quick", show_default=True)
@click.option("--nodes", "node_counts", default="1,2", show_default=True,
              help="Cluster sizes to measure, one CPU per node.")
def main(preset: str, node_counts: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        wall, reference = sweep(preset, Path(scratch) / "local", "--threads", "1")
        points = len(table(reference))
        print(f"{preset}: {points} points without Ray (1 job, 1 thread): {wall:.0f} s, "
              f"{points / wall * 60:.1f} points/min")
        for nodes in (int(n) for n in node_counts.split(",")):
            wall, stdout = on_cluster(nodes, preset, Path(scratch) / f"ray-{nodes}")
            same = "same table" if table(stdout) == table(reference) else "TABLE DIFFERS"
            print(f"{preset}: {points} points on {nodes} Ray node(s), 1 CPU each: {wall:.0f} s,"
                  f" {points / wall * 60:.1f} points/min ({same} as without Ray)")


if __name__ == "__main__":
    main()
