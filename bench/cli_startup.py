"""How long ``fedleak --help`` takes (the CLI imports heavy modules only inside commands).

    .venv/bin/python bench/cli_startup.py            # median of 7 runs
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

FEDLEAK = Path(sys.executable).with_name("fedleak")


def seconds(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(FEDLEAK), *args], check=True, capture_output=True)
    return time.perf_counter() - started


if __name__ == "__main__":
    for args in (["--help"], ["attack", "--help"], ["list"]):
        runs = [seconds(*args) for _ in range(7)]
        print(f"fedleak {' '.join(args)}: median {statistics.median(runs):.2f} s "
              f"(min {min(runs):.2f}, max {max(runs):.2f}) over {len(runs)} runs")
