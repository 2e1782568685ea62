"""Run a sweep: measure every point the store does not hold yet, one measurement per commit.

Per point, in this order, each skipped when the store already has it:

1. **attack**: start a victim process for the point (its defense chain, the first K·n images
   of the split, n per round, ``--allow-reveal`` with a fresh token), run
   :func:`fedleak.harness.attacker.run.run_attack` for K rounds into
   ``RUN/points/<point_id>/attack/`` and store the scores, ε and picture paths;
2. **utility**: :func:`fedleak.harness.sweep.measure.utility.measure_utility` (its own victim);
3. **audit** (with ``[sweep.audit]``):
   :func:`fedleak.harness.sweep.measure.point_audit.measure_audit` (its own victim, started with
   ``--allow-audit``).

Against victims the user already runs (``victims``), no process is started: the attack and the
utility training talk to that address, and the defense is whatever that victim runs (its
``Describe`` is recorded). A point that fails is marked ``failed`` with the error and the sweep
goes on; a re-run retries it. ``jobs > 1`` measures points in a pool of worker processes, each
point with its own victim processes; every worker writes its own measurements to the store.
With ``ray`` the points run as Ray tasks on a cluster and the driver alone writes the store
(:mod:`fedleak.harness.sweep.ray_backend`).

With ``pack_points`` K > 1, points that differ only in their defenses are measured K at a
time (:func:`pack_units`): their victims run side by side and each round of all of them is
attacked as one packed computation (one job, one Ray task, one GPU kept busy); each point
keeps its own measurements, the ones it gets alone.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.grid.spec import SweepSpec
from fedleak.harness.sweep.measure.checkpoints import checkpoint_path, ensure_checkpoint
from fedleak.harness.sweep.measure.leakage import pack_key
from fedleak.harness.sweep.measure.measurements import done_line
from fedleak.harness.sweep.measure.point import Credentials, Needs, measure_pack
from fedleak.harness.sweep.progress import ProgressSink, QueueProgress, TqdmProgress, replay
from fedleak.harness.sweep.ray_backend import RayOptions, run_on_ray
from fedleak.harness.sweep.store import STORE_NAME, DuplicateMeasurement, ResultStore

SPEC_NAME = "spec.toml"


@dataclass
class SweepOptions:
    """How to run: parallel jobs, torch threads per job, user-run victims, progress bars."""

    jobs: int = 1
    threads: int | None = None
    victims: tuple[str, ...] = ()
    token: str | None = None
    score_token: str | None = None
    ray: RayOptions | None = None  # run points as Ray tasks (fedleak sweep --ray)
    show_progress: bool = True
    pack_points: int = 1  # points attacked as one packed computation (same but defenses)
    device: str = "cpu"  # where attacks run without Ray (with Ray: [sweep.resources])


@dataclass
class SweepOutcome:
    """What one invocation did."""

    run_dir: Path
    points: int
    skipped: int
    measured: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    wall_time_s: float = 0.0


def default_run_dir(spec: SweepSpec) -> Path:
    return Path("runs") / f"sweep-{spec.name}"


def run_sweep(
    spec: SweepSpec,
    run_dir: Path,
    options: SweepOptions | None = None,
    echo: Callable[[str], Any] = print,
) -> SweepOutcome:
    """Measure what ``run_dir``'s store lacks of ``spec``'s grid; returns what was done."""
    options = options or SweepOptions()
    started = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPEC_NAME).write_text(spec.source)
    points = spec.points(options.victims)
    with ResultStore(run_dir / STORE_NAME) as store:
        store.add_points(points)
        store.release_running()  # left by a sweep that was killed
        store.set_meta("name", spec.name)
        todo = [p for p in points if _missing(store, p)]
        units = pack_units(todo, [needs_of(store, p).attack for p in todo], options.pack_points)
    outcome = SweepOutcome(run_dir, len(points), len(points) - len(todo))
    if outcome.skipped:
        echo(f"{outcome.skipped} of {len(points)} point(s) already measured in "
             f"{run_dir / STORE_NAME}; measuring the other {len(todo)}")
    for point in todo:
        ensure_checkpoint(point, run_dir, echo)
    progress = TqdmProgress(len(points), outcome.skipped, options.show_progress, echo)
    threads = options.threads or max(1, (os.cpu_count() or 1) // max(1, options.jobs))
    try:
        if options.ray is not None:
            results = run_on_ray(units, run_dir, spec.resources,
                                 Credentials(options.token, options.score_token), options.ray,
                                 progress, options.threads) if todo else []
        elif options.jobs <= 1 or len(units) <= 1:
            saved = os.environ.get("OMP_NUM_THREADS")
            previous = _set_threads(threads)
            try:
                results = [result for unit in units
                           for result in measure_points(
                               [p.to_json() for p in unit], str(run_dir), options.token,
                               progress, options.score_token, options.device)]
            finally:
                _set_threads(previous)
                if saved is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = saved
        else:
            results = _run_pool(units, run_dir, options, threads, progress)
    except KeyboardInterrupt:  # what was measured stays; nothing is left "running"
        with ResultStore(run_dir / STORE_NAME) as store:
            store.release_running()
        raise
    finally:
        progress.close()
    for point_id, label, status, error in results:
        if status == "failed":
            outcome.failed.append((point_id, label, error))
        else:
            outcome.measured.append(point_id)
    outcome.wall_time_s = time.perf_counter() - started
    return outcome


def pack_units(points: list[Point], attacking: list[bool], size: int) -> list[list[Point]]:
    """``points`` cut into units of work: up to ``size`` points that still need an attack and
    share :func:`~fedleak.harness.sweep.measure.leakage.pack_key` per unit, every other point alone;
    in the order the points come."""
    units: list[list[Point]] = []
    open_units: dict[str, list[Point]] = {}
    for point, attack in zip(points, attacking, strict=True):
        key = pack_key(point) if attack and size > 1 else None
        if key is None:
            units.append([point])
            continue
        unit = open_units.get(key)
        if unit is None or len(unit) >= size:
            unit = open_units[key] = []
            units.append(unit)
        unit.append(point)
    return units


def _missing(store: ResultStore, point: Point) -> bool:
    needs = needs_of(store, point)
    return needs.attack or needs.utility


def _set_threads(threads: int) -> int:
    """Torch threads here and, through OMP_NUM_THREADS, in victims started from here."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return previous


# --------------------------------------------------------------------------- the pool

_worker_sink: ProgressSink | None = None


def _init_worker(events: Any, threads: int) -> None:
    from fedleak.harness.wire.serving import die_with_parent

    die_with_parent()  # a killed sweep takes its workers (and their victims) with it
    global _worker_sink
    _worker_sink = QueueProgress(events)
    _set_threads(threads)


def _pool_task(chain: list[list[str]], run_dir: str, token: str | None,
               score_token: str | None, device: str) -> list[tuple[str, str, str, str]]:
    assert _worker_sink is not None
    return [result for point_jsons in chain
            for result in measure_points(point_jsons, run_dir, token, _worker_sink,
                                         score_token, device)]


def utility_chains(units: list[list[Point]]) -> list[list[list[Point]]]:
    """``units`` grouped so that units sharing a utility measurement (the attacks of a
    portfolio at one setting: :attr:`Point.utility_id`) run one after the other in one job: the
    first trains it, the others copy it, and two jobs never train the same one at once."""
    chains: list[list[list[Point]]] = []
    chain_of: dict[str, int] = {}
    for unit in units:
        ids = {p.utility_id for p in unit if p.utility_settings.enabled}
        index = next((chain_of[i] for i in ids if i in chain_of), None)
        if index is None:
            index = len(chains)
            chains.append([])
        chains[index].append(unit)
        for i in ids:
            chain_of.setdefault(i, index)
    return chains


def _run_pool(units: list[list[Point]], run_dir: Path, options: SweepOptions, threads: int,
              progress: TqdmProgress) -> list[tuple[str, str, str, str]]:
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    results = []
    with futures.ProcessPoolExecutor(options.jobs, mp_context=context,
                                     initializer=_init_worker,
                                     initargs=(events, threads)) as pool:
        pending = {pool.submit(_pool_task, [[p.to_json() for p in unit] for unit in chain],
                               str(run_dir), options.token, options.score_token,
                               options.device): [p for unit in chain for p in unit]
                   for chain in utility_chains(units)}
        try:
            while pending:
                _drain(events, progress, wait=0.2)
                for done in [f for f in pending if f.done()]:
                    unit = pending.pop(done)
                    try:
                        results.extend(done.result())
                    except Exception as err:  # the worker process itself died
                        results.extend((point.point_id, point.label, "failed",
                                        f"{type(err).__name__}: {err}") for point in unit)
            _drain(events, progress, wait=0.0)
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    _drain(events, progress, wait=0.0)
    return results


def _drain(events: Any, progress: TqdmProgress, wait: float) -> None:
    try:
        replay(events.get(timeout=wait) if wait else events.get_nowait(), progress)
        while True:
            replay(events.get_nowait(), progress)
    except queue_module.Empty:
        pass


# --------------------------------------------------------------------------- one point


def measure_points(point_jsons: list[str], run_dir: str, token: str | None,
                   progress: ProgressSink, score_token: str | None = None,
                   device: str = "cpu") -> list[tuple[str, str, str, str]]:
    """Measure what the store lacks for one unit of points (one point, or a pack), recording
    each measurement as it finishes; returns (id, label, status, error) per point."""
    points = [Point.from_json(text) for text in point_jsons]
    root = Path(run_dir)
    with ResultStore(root / STORE_NAME) as store:
        for point in points:
            share_utility(store, point)
            share_audit(store, point)
        needs = [needs_of(store, point) for point in points]
        for point, need in zip(points, needs, strict=True):
            progress.start(point.point_id, point.label, need.steps(point))
            store.set_status(point.point_id, "running")

        def recorder(pid: str) -> Callable[[str, Any, float], None]:
            def record(kind: str, measurement: Any, started: float) -> None:
                store.record(pid, kind, measurement.to_json(), started)

            return record

        errors = measure_pack(points, root, [checkpoint_path(p, root) for p in points], needs,
                              Credentials(token, score_token), progress,
                              [recorder(p.point_id) for p in points], device=device)
        results = []
        for point, err in zip(points, errors, strict=True):
            pid = point.point_id
            if err is not None:  # recorded with the point; the sweep goes on
                error = f"{type(err).__name__}: {err}"
                store.set_status(pid, "failed", error)
                progress.end(pid, f"FAILED {point.label} [{pid}]: {error}")
                results.append((pid, point.label, "failed", error))
                continue
            store.set_status(pid, "done")
            progress.end(pid, done_line(point.label, pid, *store.finished(pid),
                                        audit=store.audit(pid)))
            results.append((pid, point.label, "done", ""))
        return results


def share_utility(store: ResultStore, point: Point) -> None:
    """Copy the utility another attack of the portfolio measured at this point's setting
    (utility does not depend on the attack), so it is trained once per setting."""
    if not point.utility_settings.enabled or store.done(point.point_id, "utility"):
        return
    shared = store.shared_utility(point)
    if shared is not None:
        try:
            store.record(point.point_id, "utility", shared, time.time())
        except DuplicateMeasurement:
            pass


def share_audit(store: ResultStore, point: Point) -> None:
    """Copy the audit another attack of the portfolio played at this point's setting (the game
    measures the defended update, not the attack), so it is played once per setting."""
    if point.audit is None or store.done(point.point_id, "audit"):
        return
    shared = store.shared_audit(point)
    if shared is not None:
        try:
            store.record(point.point_id, "audit", shared, time.time())
        except DuplicateMeasurement:
            pass


def needs_of(store: ResultStore, point: Point) -> Needs:
    """Which measurements of ``point`` the store lacks."""
    return Needs(attack=not store.done(point.point_id, "attack"),
                 utility=point.utility_settings.enabled
                 and not store.done(point.point_id, "utility"),
                 audit=point.audit is not None and not store.done(point.point_id, "audit"))
