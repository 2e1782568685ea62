"""Repeated real deployments of the audited quickstart: how many end with a report.

Issue 49's "done when": Flower's quickstart-pytorch deployed with ``examples/flower_deploy.py``
on a real SuperLink with 2 SuperNodes, audited as docs/flower.md says, at 64 and at 600 photos
per node, 5 runs each; every run must end with a report (``metrics.json`` ``status``
``finished`` and exit 0) or a non-zero exit naming why, never silently (the original failure:
``flwr run`` and the script exited 0 while ``metrics.json`` still said ``status: "running"``).

Each run is one ``flower_deploy.py`` process, sequential, its output kept in ``--logs``
(``images-N-run-K.log``). After each the script reads the run's ``metrics.json`` and checks

- **ended**: ``report`` (exit 0, ``status`` ``finished``), ``named`` (a non-zero exit with a
  ``flower_deploy.py:`` line saying why) or ``SILENT`` (anything else: exit 0 with a report
  that is not ``finished``, or none; a non-zero exit that names nothing);
- **the original silent report**: ``status`` still ``running`` once ``flwr run`` ended (the
  script now exits 3 on it; before, 0);
- **floors**: every printed line with a PSNR figure has its floor on the line or the next
  one, and every scored round in ``metrics.json`` carries ``floors``;
- **nothing recovered in words**: where no image is above its floor (``summary.floors.above``
  0), the output says "no image recovered beyond a constant guess".

and prints one line per run and the tally:

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_deploy_runs.py --images 64 600 --runs 5 \\
        --iterations 20 --logs /tmp/deploy-runs

``--iterations`` is the audit's budget per update (objective evaluations × 1 restart; the
quickstart's default is 600): a small one keeps ten deployments within an hour on a loaded
machine; it changes the figure, not whether a report is written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "examples" / "flower_deploy.py"
QUICKSTART = ROOT / "examples" / "flower_quickstart"
#: the words the audit prints when no image is above its floor (fedleak.harness.metrics.floors)
NOTHING = "no image recovered beyond a constant guess"
PSNR_FIGURE = re.compile(r"PSNR\s+-?\d+(\.\d+)?\s*dB")


@dataclass
class Outcome:
    """What one deployment ended with."""

    images: int
    run: int
    rc: int
    seconds: float
    status: str | None
    reason: str | None
    named: list[str] = field(default_factory=list)
    figures: int = 0
    figures_without_floor: list[str] = field(default_factory=list)
    rounds_without_floors: int = 0
    nothing_recovered: bool | None = None
    nothing_said: bool = False
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def ended(self) -> str:
        """``report``, ``named`` or ``SILENT``."""
        if self.rc == 0 and self.status == "finished":
            return "report"
        if self.rc != 0 and self.named:
            return "named"
        return "SILENT"

    @property
    def running_after_flwr(self) -> bool:
        """The original silent report: ``metrics.json`` still ``running`` after ``flwr run``."""
        return self.status == "running"

    def line(self) -> str:
        floors = (f"{self.figures} PSNR line(s), {len(self.figures_without_floor)} without a "
                  f"floor; {self.rounds_without_floors} scored round(s) without floors")
        words = ("" if self.nothing_recovered is None else
                 "; nothing above the floor, said in words" if self.nothing_recovered and
                 self.nothing_said else
                 "; nothing above the floor, NOT SAID" if self.nothing_recovered else
                 "; images above the floor")
        why = f" ({self.named[-1][:160]})" if self.named and self.ended != "report" else ""
        return (f"  {self.images} photos/node, run {self.run}: {self.ended}, exit {self.rc}, "
                f"status {self.status}{why}; {floors}{words}; {self.seconds:.0f} s, load "
                f"{self.load[0]:.1f} -> {self.load[1]:.1f}")


def deploy(images: int, run: int, iterations: int, logs: Path, timeout: float,
           extra: str) -> Outcome:
    """One deployment of the quickstart at ``images`` photos per node, checked."""
    out = logs / f"images-{images}-run-{run}"
    config = (f'out="{out}" iterations={iterations} images-per-node={images} overwrite=true '
              f"{extra}").strip()
    command = [sys.executable, str(DEPLOY), str(QUICKSTART), "--nodes", "2",
               "--run-config", config, "--timeout", str(timeout)]
    log = logs / f"images-{images}-run-{run}.log"
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    with log.open("w") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        rc = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=timeout + 120).returncode
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    report = _report(out / "metrics.json")
    outcome = Outcome(images, run, rc, seconds, report.get("status"),
                      report.get("status_reason"), load=(load0, os.getloadavg()[0]))
    outcome.named = [line for line in text.splitlines() if line.startswith("flower_deploy.py:")]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if PSNR_FIGURE.search(line) and "$ " not in line[:2]:
            outcome.figures += 1
            beside = line + (lines[i + 1] if i + 1 < len(lines) else "")
            if "floor" not in beside:
                outcome.figures_without_floor.append(line.strip())
    for entry in report.get("rounds", []):
        if entry.get("images") and not entry.get("floors"):
            outcome.rounds_without_floors += 1
    floors = (report.get("summary") or {}).get("floors")
    if floors:
        outcome.nothing_recovered = int(floors.get("above", 0)) == 0
        outcome.nothing_said = NOTHING in text
    return outcome


def _report(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[64, 600],
                        help="photos per node, one set of runs each")
    parser.add_argument("--runs", type=int, default=5, help="deployments per size")
    parser.add_argument("--iterations", type=int, default=20,
                        help="the audit's iterations per update (x 1 restart)")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/fedleak-deploy-runs"),
                        help="an absolute folder for each run's log and audit folder")
    parser.add_argument("--timeout", type=float, default=1500,
                        help="flower_deploy.py --timeout of each run")
    parser.add_argument("--run-config-extra", default="",
                        help="more flwr run --run-config pairs (e.g. probe=\"trap-weights\")")
    args = parser.parse_args()
    logs = args.logs.resolve()
    logs.mkdir(parents=True, exist_ok=True)
    print(f"quickstart-pytorch (examples/flower_quickstart) on a real SuperLink, 2 SuperNodes, "
          f"via examples/flower_deploy.py; {args.runs} run(s) each at {args.images} photos per "
          f"node; audit {args.iterations} iterations x 1 restart per update, attack seed 0; "
          f"logs in {logs}; load {os.getloadavg()[0]:.1f}", flush=True)
    outcomes = []
    for images in args.images:
        for run in range(1, args.runs + 1):
            try:
                outcome = deploy(images, run, args.iterations, logs, args.timeout,
                                 args.run_config_extra)
            except subprocess.TimeoutExpired:
                outcome = Outcome(images, run, -1, args.timeout + 120, None,
                                  "flower_deploy.py itself outlived its --timeout")
            outcomes.append(outcome)
            print(outcome.line(), flush=True)
    print("tally:")
    for images in args.images:
        mine = [o for o in outcomes if o.images == images]
        count = {k: sum(o.ended == k for o in mine) for k in ("report", "named", "SILENT")}
        running = sum(o.running_after_flwr for o in mine)
        unfloored = sum(len(o.figures_without_floor) + o.rounds_without_floors for o in mine)
        unsaid = sum(bool(o.nothing_recovered and not o.nothing_said) for o in mine)
        print(f"  {images} photos/node: {count['report'] + count['named']} of {len(mine)} "
              f"ended with a report or a named non-zero exit ({count['report']} report, "
              f"{count['named']} named, {count['SILENT']} silent); metrics.json still "
              f"'running' after flwr run: {running}; figures without a floor: {unfloored}; "
              f"nothing recovered but not said: {unsaid}")
    return 0 if all(o.ended != "SILENT" for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
