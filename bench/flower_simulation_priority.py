"""The audit's worker beside the nodes under Flower's simulation engine: who gets the cores.

Under the simulation engine the SuperNodes train in Ray actors, which Ray starts at niceness
+15; the audit's worker is niced ``nice`` (+10) over the federation's processes
(:func:`fedleak.harness.flower.audit_worker.federation_niceness`). Three federations of the
same settings (``fedleak flower simulate``'s, in this process: the ServerApp here, the nodes
in Ray actors), per round the wall time from the train messages sent to the replies
aggregated:

- ``unaudited``: no audit;
- ``base = ServerApp``: the worker niced +10 over the ServerApp's process (the rule before
  ``federation_niceness``: niceness 10, above the actors' 15 in priority);
- ``base = nodes``: the worker niced over the nodes' niceness (15 + 10: past 19, so niceness
  19 under ``SCHED_IDLE``).

The niceness of the actors and of the worker is read from ``/proc`` during each run. The audit
attacks with ``--iterations`` per update (work), so the worker stays busy through the rounds.

    OMP_NUM_THREADS=1 .venv/bin/python bench/flower_simulation_priority.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

from round_timer import timed_rounds  # bench/, this script's folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _niceness(stop: threading.Event, seen: dict[str, set[str]]) -> None:
    """Sample the niceness (and SCHED_IDLE) of the ClientApp actors and this process's worker."""
    me = str(os.getpid())
    while not stop.wait(1.0):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # from field 3, proc(5)'s numbering
            parent, nice, policy = fields[1], int(fields[16]), int(fields[38])
            where = f"{nice}{' SCHED_IDLE' if policy == os.SCHED_IDLE else ''}"
            if "ClientAppActor" in cmd:
                seen["actors"].add(where)
            elif parent == me and "multiprocessing.spawn" in cmd:
                seen["worker"].add(where)


def federation(args: argparse.Namespace, out: Path, mode: str) -> tuple[list[float], dict]:
    """One simulated federation; each round's seconds and the niceness seen."""
    from fedleak.harness.flower import audit_worker
    from fedleak.harness.flower.federation import FederationSettings, simulate

    settings = FederationSettings(
        nodes=args.nodes, rounds=args.rounds, dataset=args.dataset, model=args.model,
        images=args.images, protocol="fedavg", local_epochs=args.local_epochs,
        local_batch_size=args.batch_size, lr=0.01, options=(f"iterations={args.iterations}",),
        out=str(out), audit=mode != "unaudited", score=False, overwrite=True)
    rule = audit_worker.federation_niceness
    if mode == "base = ServerApp":
        audit_worker.federation_niceness = lambda: os.getpriority(os.PRIO_PROCESS, 0)
    seen: dict[str, set[str]] = {"actors": set(), "worker": set()}
    stop = threading.Event()
    sampler = threading.Thread(target=_niceness, args=(stop, seen), daemon=True)
    sampler.start()
    try:
        with timed_rounds() as times:
            simulate(settings)
    finally:
        stop.set()
        audit_worker.federation_niceness = rule
    return times, seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="lenet-zhu")
    parser.add_argument("--images", type=int, default=512, help="images per node")
    parser.add_argument("--local-epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=4,
                        help="the audit's iterations per update (keeps its worker busy)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: federation(args, Path(tmp) / mode.replace(" ", ""), mode)
                for mode in ("unaudited", "base = ServerApp", "base = nodes")}
    print(f"{args.nodes} nodes x {args.images} {args.dataset} images, {args.model}, FedAvg "
          f"{args.local_epochs} epochs of batch {args.batch_size}, {args.rounds} rounds, "
          f"audit {args.iterations} iterations per update; load {os.getloadavg()[0]:.1f}")
    plain = sum(runs["unaudited"][0][1:])
    for mode, (times, seen) in runs.items():
        rounds = " ".join(f"{t:.2f}" for t in times)
        rest = sum(times[1:])  # round 1 includes the actors' start
        print(f"  {mode:17s} rounds {rounds} s; rounds 2-{args.rounds} {rest:.2f} s "
              f"({rest / plain:.2f} x unaudited); niceness: actors {sorted(seen['actors'])}, "
              f"worker {sorted(seen['worker'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
