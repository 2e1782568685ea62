"""Broken DP implementations against the default audit: detection rate, false-alarm rate, time.

Each *bug* is a plug-in of ``examples/broken_defenses`` (written against the documented plug-in
API; each declares the correct mechanism and implements it with one real bug), each *control*
a correct mechanism: the built-in ``dpsgd``, a third-party per-example DP-SGD plug-in
(``tests/test_plugin_package``'s ``private-sgd``, plain torch, not a subclass of the built-in),
clip + Gaussian noise, client-level DP, and client-level DP in shares under secure
aggregation (4 users and a canary client). Every audit is the default ``fedleak audit``
(:func:`fedleak.harness.attacker.games.audit_trials.run_audit` with default
:class:`~fedleak.harness.attacker.games.audit_trials.AuditSettings`: coverage on, trials chosen to
catch noise 10 % short with 99 % power, false-alarm rate 1e-4) against a victim process
(digits, ``mlp:width=16``, 8 private images, FedSGD unless said, ``--allow-audit``) over
gRPC on loopback; one victim serves a block of audits (its secret generator seeded by the
block), each audit with its own canary seed.

Results go to a JSON-lines file as they come (``--results``); a rerun skips the audits already
there, so the bench is resumable and can run in the background:

    OMP_NUM_THREADS=1 python bench/audit_bugs.py                # 20 per bug, 100 per control
    OMP_NUM_THREADS=1 python bench/audit_bugs.py --only dp-short-noise --audits 5
    python bench/audit_bugs.py --table                                 # print the table only

Targets (issue 37): every bug caught in ≥ 19 of 20 audits; every control without a violation in
≥ 100 audits; a default DP-SGD audit within 3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.games.audit_trials import AuditRecord, AuditSettings, run_audit
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = [ROOT / "examples" / "broken_defenses", ROOT / "tests" / "test_plugin_package", ROOT]
RESULTS = ROOT / "bench_out" / "audit_bugs.jsonl"
FEDAVG_SMALL_STEP = Protocol(kind="fedavg", local_epochs=1, batch_size=0, learning_rate=0.05)
FEDAVG_TWO_BATCHES = Protocol(kind="fedavg", local_epochs=1, batch_size=4, learning_rate=0.05,
                              shuffle=True)


@dataclass(frozen=True)
class Case:
    """One mechanism: a bug (should be caught) or a control (should not)."""

    key: str
    label: str
    kind: str  # "bug" or "control"
    defenses: tuple[str, ...] = ()
    protocol: Protocol = Protocol()
    users: int = 1
    batch_size: int = 8
    canary: str = "gradient"
    served: str = ""  # a defense served by `fedleak defense serve`, linked as remote
    stage: str = "update"  # the served defense's stage


CASES = (
    Case("dp-noise-weights-only", "noise on weight matrices only (per example)", "bug",
         ("dp-noise-weights-only",)),
    Case("dp-short-noise", "noise 10 % short of σC (per example)", "bug", ("dp-short-noise",)),
    Case("dp-noise-as-variance", "variance (σC)² used as the std, σ = 0.6", "bug",
         ("dp-noise-as-variance:noise-multiplier=0.6",)),
    Case("dp-noise-over-batch-twice", "noise divided by the batch size twice", "bug",
         ("dp-noise-over-batch-twice",)),
    Case("dp-clip-per-tensor", "each tensor clipped to C, accounted as one total clip", "bug",
         ("dp-clip-per-tensor",)),
    Case("dp-uniform-noise", "uniform noise of the declared variance (wrong law)", "bug",
         ("dp-uniform-noise",)),
    Case("dp-clip-the-batch", "the batch's summed gradient clipped, not each example's", "bug",
         ("dp-clip-the-batch",)),
    Case("dp-clip-norm-default", "clip at a hard-coded 1.0, declared C = 0.5", "bug",
         ("dp-clip-norm-default:max-grad-norm=0.5",)),
    Case("dp-fixed-seed", "noise from a generator seeded with 0 every step", "bug",
         ("dp-fixed-seed",)),
    Case("dp-shuffle-as-poisson", "fixed batches accounted as Poisson q = 0.5 (FedAvg, 2 steps)",
         "bug", ("dp-shuffle-as-poisson:poisson=true",), protocol=FEDAVG_TWO_BATCHES),
    Case("noise-clip-after-noise", "update noised, then clipped (clip after noise)", "bug",
         ("noise-clip-after-noise",)),
    Case("noise-weights-only", "update noise on weight matrices only, behind the proto", "bug",
         served="noise-weights-only"),
    Case("dp-noise-every-second-call", "noise redrawn every second call (per example)",
         "bug", ("dp-noise-every-second-call",)),
    Case("dp-noise-seed-cycle", "noise seeds cycling with period 5 (per example)", "bug",
         ("dp-noise-seed-cycle",)),
    Case("noise-every-second-round", "update noise redrawn every second round", "bug",
         ("noise-every-second-round",)),
    Case("noise-every-second-round-secagg",
         "update noise redrawn every second call, secagg of 4 + canary client", "bug",
         ("noise-every-second-round", "secagg:clip=8"), users=4, canary="client",
         batch_size=2),
    Case("dp-batch-calibrated-noise", "noise std σ·max‖ḡ_i‖, not σC, C = 10 (per example)", "bug",
         ("dp-batch-calibrated-noise:max-grad-norm=10",)),
    Case("dp-clip-from-batch", "clip at the batch's median norm, noise σ× it, C = 10",
         "bug", ("dp-clip-from-batch:max-grad-norm=10",)),
    Case("dp-correlated-noise", "one scalar noise draw per tensor (per example)", "bug",
         ("dp-correlated-noise",)),
    Case("dpsgd", "built-in dpsgd σ = 1, C = 1", "control", ("dpsgd:noise-multiplier=1",)),
    Case("private-sgd", "third-party per-example DP-SGD plug-in σ = 1", "control",
         ("private-sgd:noise-multiplier=1",)),
    Case("private-sgd-remote", "the same plug-in behind the proto (per-example service)",
         "control", served="private-sgd:noise-multiplier=1", stage="per-example"),
    Case("clip-noise", "clip S = 1 then Gaussian noise σ = 1", "control",
         ("clip:max-norm=1", "noise:sigma=1")),
    Case("client-dp", "client-level DP σ = 1, S = 1 (local, FedAvg one step)", "control",
         ("client-dp:noise-multiplier=1,clip-norm=1",), protocol=FEDAVG_SMALL_STEP),
    Case("client-dp-secagg", "client-level DP in shares, secagg of 4 + canary client",
         "control", ("client-dp:variant=distributed,noise-multiplier=1,clip-norm=1",
                     "secagg:clip=8"), users=4, canary="client", batch_size=2),
)


def done(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The audits already in the results file, by (case, seed)."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                out[(row["case"], int(row["seed"]))] = row
    return out


@contextmanager
def victim_for(case: Case, block: int) -> Iterator[VictimClient]:
    """A victim process for ``case`` (and its defense service), its generator seeded by
    ``block``."""
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([*map(str, PLUGINS),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    with ExitStack() as stack:
        defenses = case.defenses
        if case.served:
            service = stack.enter_context(VictimProcess(
                ["--defense", case.served], env=env,
                command=[sys.executable, "-m", "fedleak", "defense", "serve"]))
            defenses = (f"remote:address={service.address},stage={case.stage}",)
        images = f"0-{case.batch_size * case.users - 1}"
        settings = VictimSettings(dataset="digits", model="mlp:width=16", split="all",
                                  images=images, batch_size=case.batch_size,
                                  protocol=case.protocol, defenses=defenses,
                                  defense_seed=1000 + block, users=case.users, audit=True,
                                  limits=VictimLimits(audit_budget=10_000,
                                                      max_audit_trials=20_000))
        process = stack.enter_context(VictimProcess(settings, env=env))
        client = stack.enter_context(VictimClient(process.address))
        yield client


def audit_row(case: Case, seed: int, record: AuditRecord, seconds: float) -> dict[str, Any]:
    bounds = [b for b in record.bounds if not b.is_estimate]
    worst = max(bounds, key=lambda b: b.epsilon) if bounds else None
    rejected = [t for t in record.tests if t.rejected]
    return {"case": case.key, "kind": case.kind, "seed": seed, "violation": record.violation,
            "claimed_epsilon": record.claimed_epsilon, "trials": record.trials,
            "largest_epsilon_lb": worst.epsilon if worst else None,
            "largest_by": f"{worst.estimator} {worst.group}".strip() if worst else None,
            "caught_by": [f"{t.test} {t.group}".strip() for t in rejected],
            "detectable_noise": record.detectable_noise, "seconds": seconds,
            "trial_seconds": record.trial_seconds, "load": os.getloadavg()[0],
            "verdict": record.verdict}


def run_case(case: Case, audits: int, block_size: int, results: Path,
             first_seed: int = 0) -> None:
    finished = done(results)
    seeds = [s for s in range(first_seed, first_seed + audits)
             if (case.key, s) not in finished]
    # blocks aligned on multiples of block_size: each victim seed (1000 + block) serves one
    # block of audit seeds, whichever --first-seed split the case across processes
    blocks: dict[int, list[int]] = {}
    for seed in seeds:
        blocks.setdefault(seed // block_size, []).append(seed)
    for index, block in blocks.items():
        with victim_for(case, index) as client:
            for seed in block:
                settings = AuditSettings(canary=case.canary, seed=seed, show_progress=False,
                                         batch=512)
                began = time.perf_counter()
                record = run_audit(client, settings, None, log=lambda _: None)
                row = audit_row(case, seed, record, time.perf_counter() - began)
                with results.open("a") as file:
                    file.write(json.dumps(row) + "\n")
                mark = "VIOLATION" if row["violation"] else "no violation"
                print(f"{case.key} seed {seed}: {mark}, {row['trials']} trials, "
                      f"{row['seconds']:.1f} s, load {row['load']:.1f}", flush=True)


def table(results: Path) -> list[str]:
    """The markdown table of every case in the results file."""
    rows = done(results).values()
    lines = ["| mechanism | kind | audits | violations | rate | caught by (audits) | "
             "trials (median) | s per audit (median) | catches noise below (median) | "
             "load (mean) |",
             "|" + "---|" * 10]
    for case in CASES:
        mine = [r for r in rows if r["case"] == case.key]
        if not mine:
            continue
        hits = sum(r["violation"] for r in mine)
        detect = [r["detectable_noise"] for r in mine if r["detectable_noise"]]
        tests = Counter(t for r in mine for t in {c.split()[0] for c in r["caught_by"]})
        caught = ", ".join(f"{t} {n}" for t, n in tests.most_common()) or "–"
        lines.append(
            f"| {case.label} | {case.kind} | {len(mine)} | {hits} | "
            f"{hits / len(mine):.0%} | {caught} | "
            f"{statistics.median(r['trials'] for r in mine):.0f} | "
            f"{statistics.median(r['seconds'] for r in mine):.1f} | "
            f"{(f'{statistics.median(detect):.2f}σ' if detect else '–')} | "
            f"{statistics.mean(r['load'] for r in mine):.1f} |")
    return lines


@click.command()
@click.option("--only", multiple=True, type=click.Choice([c.key for c in CASES]),
              help="These cases only (repeatable).")
@click.option("--audits", default=None, type=click.IntRange(1),
              help="Audits per case (default: 20 per bug, 100 per control).")
@click.option("--block", default=20, show_default=True, type=click.IntRange(1),
              help="Audits per victim process.")
@click.option("--results", type=click.Path(dir_okay=False), default=str(RESULTS),
              show_default=True, help="JSON-lines results file (appended; reruns resume).")
@click.option("--first-seed", default=0, show_default=True, type=click.IntRange(0),
              help="Audit seeds from this one on (to share a case between processes).")
@click.option("--table", "table_only", is_flag=True, help="Print the table and exit.")
def main(only: tuple[str, ...], audits: int | None, block: int, results: str,
         first_seed: int, table_only: bool) -> None:
    path = Path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not table_only:
        for case in CASES:
            if only and case.key not in only:
                continue
            run_case(case, audits or (20 if case.kind == "bug" else 100), block, path,
                     first_seed)
    for line in table(path):
        print(line)
    print(f"\nOMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"{os.cpu_count()} CPUs visible, load now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
