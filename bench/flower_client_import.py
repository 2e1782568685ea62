"""What the audit costs a ClientApp at start: its import time with and without the audit's lines.

Flower starts a fresh ``flwr-clientapp`` process for every message, and the process must start
within the task token's lifetime (30 s before it is activated, then heartbeats): a ClientApp
whose imports outlast it under load is restarted in a loop ("Runtime task-token authentication
failed", docs/flower.md). This times, in fresh interpreters, alternately:

- **audited**: ``import pytorchexample.client_app`` of ``examples/flower_quickstart`` (the
  quickstart with docs/flower.md's lines: ``from fedleak.flower import answer_score_queries,
  remember_batch`` and ``answer_score_queries(app, INFO)``);
- **unaudited**: the same file with those two lines removed (a copy in a temporary package),

and prints the medians, their difference, the fedleak modules the audited import loads and
whether any of them is attack, defense, auditing or scoring code (or scipy / opacus /
matplotlib), with the machine's load (``os.getloadavg``) before and after.

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_client_import.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower_quickstart"
#: modules the ClientApp's import path must not load (the audit's work happens on the server,
#: and the node's scoring code is imported when the first score query arrives)
HEAVY = ("fedleak.attacks", "fedleak.defenses", "fedleak.auditing", "fedleak.harness.victim",
         "fedleak.harness.attacker", "scipy", "opacus", "matplotlib")
PROBE = ("import json, sys, time; t = time.perf_counter(); import pytorchexample.client_app; "
         "t = time.perf_counter() - t; print(json.dumps({'seconds': t, 'modules': "
         "sorted(m for m in sys.modules if m.startswith(('fedleak', 'scipy', 'opacus', "
         "'matplotlib')))}))")
AUDIT_LINES = ("from fedleak.flower import answer_score_queries, remember_batch",
               "answer_score_queries(app, INFO)")


def unaudited_copy(folder: Path) -> Path:
    """The quickstart package with the audit's two module-level lines removed."""
    package = folder / "pytorchexample"
    shutil.copytree(EXAMPLE / "pytorchexample", package)
    client = package / "client_app.py"
    lines = client.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.strip() not in AUDIT_LINES]
    if len(lines) - len(kept) != len(AUDIT_LINES):
        raise SystemExit(f"{client}: the audit's lines {AUDIT_LINES} are not there as docs/"
                         "flower.md adds them")
    client.write_text("".join(kept))
    return folder


def timed(path: Path) -> dict[str, object]:
    """One fresh interpreter importing the ClientApp module found on ``path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="imports of each, alternating")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as temp:
        plain = unaudited_copy(Path(temp))
        timed(EXAMPLE), timed(plain)  # warm the file cache for both
        audited, unaudited, modules = [], [], []
        for _ in range(args.runs):
            first = timed(EXAMPLE)
            audited.append(float(first["seconds"]))  # type: ignore[arg-type]
            modules = list(first["modules"])  # type: ignore[call-overload]
            unaudited.append(float(timed(plain)["seconds"]))  # type: ignore[arg-type]
    with_audit, without = statistics.median(audited), statistics.median(unaudited)
    heavy = [m for m in modules if m.startswith(HEAVY)]
    print(f"quickstart-pytorch ClientApp import, {args.runs} fresh interpreters each, "
          f"alternating; load {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{time.perf_counter() - started:.0f} s in all")
    print(f"  unaudited: median {without:.2f} s (min {min(unaudited):.2f}, max "
          f"{max(unaudited):.2f})")
    print(f"  audited  : median {with_audit:.2f} s (min {min(audited):.2f}, max "
          f"{max(audited):.2f}); the audit's lines add {with_audit - without:+.2f} s")
    fedleak = [m for m in modules if m.startswith("fedleak")]
    print(f"  fedleak modules the audited import loads: {len(fedleak)} "
          f"({', '.join(m for m in fedleak if m.startswith('fedleak.harness.flower'))}, ...)")
    print("  attack, defense, auditing or scoring code, scipy, opacus, matplotlib: "
          + (f"{len(heavy)} modules ({', '.join(heavy[:4])}, ...)" if heavy else "none"))


if __name__ == "__main__":
    main()
