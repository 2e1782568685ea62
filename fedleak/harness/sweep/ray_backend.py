"""Sweep points as Ray tasks: a sweep that outgrows one machine (``fedleak sweep --ray``).

Each point — its victim processes, its attack rounds, its utility training — runs as one Ray
task with the resources the spec declares (``[sweep.resources]``: ``num_cpus``,
``num_gpus``; a point given a GPU attacks with ``device=cuda``). The task measures into a
scratch folder on its node laid out like the run folder and returns what it measured: the
typed measurements and the files of its attack run (metrics.json, reconstructions, pictures:
kilobytes). The private data never crosses the network; it stays inside the victim process on
the task's node. The driver alone writes the SQLite store and the run folder, the moment each
point's result arrives, so the store stays the single truth: killing the driver loses only the
points in flight, and the same command resumes as on one machine.

A task whose worker process or node dies is re-run by Ray up to ``retries`` times
(``max_retries``) and then recorded as failed with Ray's reason; an error of the measurement
itself is not retried (it would fail again) and is recorded as on one machine. A point is
recorded once, from the one result the driver receives. Progress events travel back through a
``ray.util.queue.Queue`` and are drawn by the same bars as ``--jobs``.
"""

from __future__ import annotations

import os
import queue
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedleak.harness.sweep.grid.points import Point, PointResources
from fedleak.harness.sweep.measure.checkpoints import checkpoint_path
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    AuditMeasurement,
    UtilityMeasurement,
    done_line,
)
from fedleak.harness.sweep.measure.point import Credentials, Needs, measure_pack
from fedleak.harness.sweep.progress import ProgressSink, QueueProgress, replay
from fedleak.harness.sweep.store import STORE_NAME, ResultStore

#: How a point's outcome is summed up: (point id, label, status, error).
Result = tuple[str, str, str, str]
CHECKPOINT_NAME = "checkpoint.pt"

Measured = AttackMeasurement | UtilityMeasurement | AuditMeasurement


class RayUnavailable(RuntimeError):
    """``--ray`` without Ray installed, or no cluster at the address."""


def import_ray() -> Any:
    """The ``ray`` module, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("fedleak sweep --ray needs Ray: pip install 'fedleak[ray]' (in "
                             "this checkout: .venv/bin/pip install -c constraints.txt "
                             "-e '.[ray]')") from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """Where the cluster is (None: start a local one; ``auto``: the running one) and how
    often a task whose worker or node died is re-run."""

    address: str | None = None
    retries: int = 2


#: For a local cluster: Ray takes the node's address from this switch (on Linux it would
#: otherwise pick the address it reaches the internet from, and its servers listen there).
LOCAL_CLUSTER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK = "127.0.0.1"


def starts_local_cluster(options: RayOptions) -> bool:
    """Whether ``ray.init`` starts a cluster of this machine (no address given, none in
    ``RAY_ADDRESS``)."""
    return options.address is None and not os.environ.get("RAY_ADDRESS")


def init_options(options: RayOptions) -> dict[str, Any]:
    """The keyword arguments of ``ray.init``: a cluster of this machine alone (no address) is
    a new one (``address="local"``: ``ray.init`` would otherwise join a cluster that
    ``ray start`` left running here) with its node on the loopback address, so its listeners
    — GCS, raylet, the workers' and object manager's servers — bind there and no other machine
    can reach them."""
    kwargs: dict[str, Any] = dict(address=options.address or None, include_dashboard=False,
                                  log_to_driver=False, configure_logging=False)
    if starts_local_cluster(options):  # "local": a new cluster, never one `ray start` left
        kwargs.update(address="local", _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK)
    return kwargs


def _keep_local(ray: Any) -> None:
    """Make Ray (already imported) and the processes it starts take the loopback address as
    the node's: ``ray.init`` turns a ``_node_ip_address`` of 127.0.0.1 into the machine's
    routable address unless this switch is off."""
    os.environ.update(LOCAL_CLUSTER_ENV)
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def connect(options: RayOptions) -> Any:
    """Connect to (or start) the cluster; the ``ray`` module."""
    ray = import_ray()
    if not ray.is_initialized():
        if starts_local_cluster(options):
            _keep_local(ray)
        try:
            ray.init(**init_options(options))
        except ConnectionError as err:
            raise RayUnavailable(f"no Ray cluster at {options.address!r} ({err}); start one "
                                 "with `ray start --head` or give its address") from None
    return ray


def measure_on_node(point_jsons: list[str], needs: list[tuple[bool, bool, bool]],
                    checkpoints: list[bytes | None], credentials: Credentials, threads: int,
                    device: str, events: Any) -> dict[str, Any]:
    """The Ray task: measure one unit of points (one point, or a pack of points that differ
    only in their defenses) on this node; return measurements and files.

    Runs in a Ray worker process. It writes nothing the driver reads but its return value:
    ``measured`` and ``errors`` per point, the files of all, and the node.
    """
    import ray
    import torch

    points = [Point.from_json(text) for text in point_jsons]
    os.environ["OMP_NUM_THREADS"] = str(threads)  # victims started from here inherit it
    torch.set_num_threads(threads)
    progress = QueueProgress(events)
    measured: list[list[tuple[str, dict[str, Any], float]]] = [[] for _ in points]
    with tempfile.TemporaryDirectory(prefix="fedleak-point-") as scratch:
        root = Path(scratch)
        local_checkpoints: list[str | None] = []
        for k, (point, checkpoint) in enumerate(zip(points, checkpoints, strict=True)):
            if checkpoint is not None:
                local = root / f"checkpoint-{k}" / CHECKPOINT_NAME
                local.parent.mkdir()
                local.write_bytes(checkpoint)
                local_checkpoints.append(str(local))
            else:  # a path the spec names is on every node
                local_checkpoints.append(point.trained if isinstance(point.trained, str)
                                         else None)

        def keeper(k: int) -> Callable[[str, Measured, float], None]:
            def keep(kind: str, measurement: Measured, started: float) -> None:
                measured[k].append((kind, measurement.to_json(), started))

            return keep

        failures = measure_pack(points, root, local_checkpoints,
                                [Needs(*need) for need in needs], credentials, progress,
                                [keeper(k) for k in range(len(points))], device=device)
        errors = ["" if err is None else f"{type(err).__name__}: {err}" for err in failures]
        files = {str(path.relative_to(root)): path.read_bytes()
                 for path in sorted((root / "points").rglob("*")) if path.is_file()} \
            if (root / "points").exists() else {}
    context = ray.get_runtime_context()
    return {"measured": measured, "errors": errors, "files": files,
            "node": f"{ray.util.get_node_ip_address()} {context.get_node_id()[:8]}"}


def run_on_ray(units: list[list[Point]], run_dir: Path, resources: PointResources,
               credentials: Credentials, options: RayOptions, progress: ProgressSink,
               threads: int | None = None) -> list[Result]:
    """Measure each unit of points as one Ray task; the driver records results as they come."""
    ray = connect(options)
    from ray.util.queue import Queue

    events = Queue()
    task = ray.remote(measure_on_node).options(
        num_cpus=resources.num_cpus, num_gpus=resources.num_gpus,
        max_retries=options.retries, retry_exceptions=False)
    pending: dict[Any, list[Point]] = {}
    with ResultStore(run_dir / STORE_NAME) as store:
        for unit in units:
            needs = []
            for point in unit:
                need = Needs(attack=not store.done(point.point_id, "attack"),
                             utility=point.utility_settings.enabled
                             and not store.done(point.point_id, "utility"),
                             audit=point.audit is not None
                             and not store.done(point.point_id, "audit"))
                store.set_status(point.point_id, "running")
                progress.start(point.point_id, point.label, need.steps(point))
                needs.append((need.attack, need.utility, need.audit))
            ref = task.remote([p.to_json() for p in unit], needs,
                              [_checkpoint_bytes(p, run_dir) for p in unit], credentials,
                              threads or resources.threads, resources.device, events)
            pending[ref] = unit
    results: list[Result] = []
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            _drain(events, progress)
            for ref in ready:
                results.extend(_record(ray, ref, pending.pop(ref), run_dir, progress))
        _drain(events, progress)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return results


def _checkpoint_bytes(point: Point, run_dir: Path) -> bytes | None:
    """A checkpoint the sweep trained travels with the task (other nodes cannot read it)."""
    if point.trained is not True:
        return None
    path = checkpoint_path(point, run_dir)
    return Path(path).read_bytes() if path else None


def _record(ray: Any, ref: Any, unit: list[Point], run_dir: Path,
            progress: ProgressSink) -> list[Result]:
    """Write one task's files and measurements (the driver alone writes the store)."""
    results: list[Result] = []
    with ResultStore(run_dir / STORE_NAME) as store:
        try:
            returned = ray.get(ref)
        except ray.exceptions.RayError as err:  # the worker or node died, retries spent
            error = f"{type(err).__name__}: {_first_line(err)}"
            for point in unit:
                store.set_status(point.point_id, "failed", error)
                progress.end(point.point_id, f"FAILED {point.label} [{point.point_id}]: "
                             f"{error}")
                results.append((point.point_id, point.label, "failed", error))
            return results
        for relative, data in returned["files"].items():
            target = run_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        where = f" on {returned['node']}"
        for point, measured, error in zip(unit, returned["measured"], returned["errors"],
                                          strict=True):
            pid = point.point_id
            for kind, metrics, started in measured:
                metrics["node"] = returned["node"]
                store.record(pid, kind, metrics, started)
            if error:
                store.set_status(pid, "failed", error)
                progress.end(pid, f"FAILED {point.label} [{pid}]{where}: {error}")
                results.append((pid, point.label, "failed", error))
                continue
            store.set_status(pid, "done")
            progress.end(pid, done_line(point.label, pid, *store.finished(pid), where,
                                        audit=store.audit(pid)))
            results.append((pid, point.label, "done", ""))
    return results


def _drain(events: Any, progress: ProgressSink) -> None:
    try:
        while True:
            replay(events.get_nowait(), progress)
    except queue.Empty:
        pass


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def wait_for_nodes(count: int, timeout: float = 60.0,
                   echo: Callable[[str], Any] = print) -> None:
    """Block until the connected cluster has ``count`` live nodes (for scripts and tests)."""
    ray = import_ray()
    deadline = time.monotonic() + timeout
    while sum(n["Alive"] for n in ray.nodes()) < count:
        if time.monotonic() > deadline:
            raise RayUnavailable(f"the Ray cluster has fewer than {count} live nodes")
        time.sleep(0.5)
    echo(f"Ray cluster: {count} node(s)")
