"""Wall time of one audited Flower round against the same round unaudited, and against
``fedleak attack`` on fedleak's own victim, with the same model and attack budget.

Three measurements, each a fresh process tree (the figures include start-up):

1. ``fedleak flower simulate --no-audit``: Flower's simulation engine (Ray), N nodes, one round
   of FedSGD on one digits image each;
2. the same with the audit: every node's reply attacked (inverting-gradients, ``--iterations``,
   one restart) and scored on its node;
3. ``fedleak victim serve`` + ``fedleak attack`` (one round, same model, same budget), the two
   processes fedleak measures with when there is no Flower.

It prints the three wall times, the audit's cost per round (2 − 1) and, per node, the attack's
own wall time from metrics.json. ``--with-prune`` adds the leakage with and without a
``prune:p=0.9`` client mod (mean PSNR over the nodes, scored on the nodes).

    .venv/bin/python bench/flower_overhead.py --nodes 2 --iterations 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
FEDLEAK = [sys.executable, "-m", "fedleak"]


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - started


def simulate(args: argparse.Namespace, out: Path, *extra: str) -> float:
    return timed([*FEDLEAK, "flower", "simulate", "--nodes", str(args.nodes), "--rounds", "1",
                  "--model", args.model, "--dataset", "digits", "--images", "1",
                  "-o", f"iterations={args.iterations}", "-o", "restarts=1", "--out", str(out),
                  *extra], out.parent)


def victim_attack(args: argparse.Namespace, out: Path) -> float:
    """Victim process + attacker process, one round; seconds from victim start to result."""
    started = time.perf_counter()
    victim = subprocess.Popen([*FEDLEAK, "victim", "serve", "--dataset", "digits", "--split",
                               "train", "--images", "0-0", "--model", args.model, "--port", "0"],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        address = ""
        assert victim.stdout is not None
        for line in victim.stdout:
            if "127.0.0.1:" in line or "listening" in line.lower():
                address = next(w for w in line.split() if ":" in w and w[-1].isdigit())
                break
        if not address:
            sys.exit("the victim did not report its address")
        timed([*FEDLEAK, "attack", "--victim", address, "--attack", "inverting-gradients",
               "--iterations", str(args.iterations), "--restarts", "1", "--quiet", "--out",
               str(out)], out.parent)
    finally:
        victim.terminate()
        victim.wait(timeout=30)
    return time.perf_counter() - started


def mean_psnr(out: Path) -> float | None:
    return json.loads((out / "metrics.json").read_text())["summary"]["mean_psnr"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--model", default="mlp:width=32,depth=1")
    parser.add_argument("--with-prune", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = simulate(args, root / "plain", "--no-audit")
        audited = simulate(args, root / "audited")
        alone = victim_attack(args, root / "victim")
        attack_s = [r["wall_time_s"] for r in
                    json.loads((root / "audited" / "metrics.json").read_text())["rounds"]]
        print(f"model {args.model}, digits, {args.nodes} nodes x 1 image, FedSGD, "
              f"inverting-gradients {args.iterations} iterations x 1 restart, 1 torch thread, "
              f"load {os.getloadavg()[0]:.1f}")
        print(f"  flower simulate, unaudited round : {plain:6.1f} s")
        print(f"  flower simulate, audited round   : {audited:6.1f} s "
              f"(audit +{audited - plain:.1f} s; attacks {', '.join(f'{s:.1f}' for s in attack_s)}"
              " s per node)")
        print(f"  fedleak victim + fedleak attack  : {alone:6.1f} s (one round, one image)")
        print(f"  mean PSNR through Flower {mean_psnr(root / 'audited'):.2f} dB; against the "
              f"victim {mean_psnr(root / 'victim'):.2f} dB (different images and θ)")
        if args.with_prune:
            simulate(args, root / "pruned", "--defense", "prune:p=0.9")
            print(f"  leakage with a prune:p=0.9 mod: mean PSNR {mean_psnr(root / 'pruned'):.2f}"
                  f" dB (without: {mean_psnr(root / 'audited'):.2f} dB)")


if __name__ == "__main__":
    main()
