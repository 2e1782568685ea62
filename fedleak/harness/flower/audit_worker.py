"""The audit's worker: updates attacked off the round's critical path.

A Flower round waits for nothing the audit does. The strategy wrapper reads each reply (a few
tensor copies), hands the update to an :class:`AuditWorker` and passes the replies on; the
worker attacks them in a process of its own, started once per federation with
``multiprocessing``'s *spawn* (a fresh interpreter: nothing of the ServerApp's gRPC or thread
state is inherited), at a lower CPU priority than the federation's processes
(``nice``, default +10 over the nodes' niceness — :func:`federation_niceness`: under Flower's
simulation engine the nodes are Ray actors at Ray's +15, so the worker goes past 19, where it
runs at 19 under ``SCHED_IDLE``; on a machine the nodes share, the scheduler gives the nodes'
training the cores first and the attack what is left) and with ``threads`` torch threads.

- **Bounded queue.** At most ``queue`` updates wait or run at once; an update that finds it
  full is *skipped* (the caller records it, with the reason), never queued without bound.
- **Budget in work.** Each update gets its attack's own budget — ``iterations`` × ``restarts``
  objective evaluations, as the user set them — whatever the round's wall time.
- **Behind.** :meth:`AuditWorker.submit` says how many updates were ahead of this one, so the
  record shows when the audit falls behind the federation.
- **Pictures** are drawn in the worker: a reconstruction's ``reconstruction.npy`` and
  ``reconstruction.png`` (a grid of hundreds of images takes seconds to draw) are written into
  the job's folder there, never in the ServerApp's process between rounds.
- **Results** come back as :class:`AuditResult` (the reconstruction on the CPU, or the error)
  when the caller asks (:meth:`AuditWorker.results`), and all of them at the end
  (:meth:`AuditWorker.drain`), after the federation's last round.

Why not a Ray actor under Flower's simulation: an actor takes a Ray CPU slot, i.e. takes it
from the SuperNodes' actors the simulation packs onto the cores; a niced process takes only
what the nodes leave. The model travels to the worker once, pickled: a model whose class
cannot be imported by name (defined inside a function) cannot, and the audit then attacks in
this process (``AuditWorker`` refuses it with that reason; the caller falls back).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.pictures import save_reconstruction
from fedleak.harness.zoo.datasets import DatasetInfo, denormalize

#: the worker's default niceness over the federation's processes, and queue bound
DEFAULT_NICE = 10
DEFAULT_QUEUE = 8
#: the niceness Ray gives its workers when ``RAY_worker_niceness`` is not set (Ray's default)
RAY_WORKER_NICENESS = 15


def federation_niceness() -> int:
    """The niceness of the processes that train the federation, the base the worker's
    ``nice`` is added to: this process's own, or — when Ray is loaded in this process, as under
    Flower's simulation engine, whose ServerApp shares the process with the Ray backend and
    whose SuperNodes are Ray actors — the niceness Ray starts its workers at
    (``RAY_worker_niceness``, default +15), if higher. Without it the worker at +10 would
    outrank nodes at +15 and take the cores from their training. Only the presence of the
    module is read: the simulation engine may still be inside ``import ray`` (its module
    half-built) when the first update arrives."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if "ray" not in sys.modules:
        return own
    try:
        workers = int(os.environ.get("RAY_worker_niceness", RAY_WORKER_NICENESS))
    except ValueError:
        workers = RAY_WORKER_NICENESS
    return max(own, workers)


@dataclass
class AuditJob:
    """One update to attack: who sent it, the update, and the attack to run on it."""

    key: tuple[int, int]
    received: ReceivedUpdate
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    attack: str
    options: dict[str, Any]
    seed: int
    #: the folder the worker writes the reconstruction's files into (None: it writes none)
    pictures: Path | None = None


@dataclass
class AuditResult:
    """The attack's outcome for :attr:`AuditJob.key`: the reconstruction (None with ``error``),
    its wall time in the worker, and whether the worker wrote its files (``drawn``)."""

    key: tuple[int, int]
    reconstruction: Any = None
    wall_s: float = 0.0
    error: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    drawn: bool = False
    #: the worker process died before it answered: the update was never attacked
    lost: bool = False


class WorkerUnavailable(RuntimeError):
    """The worker process cannot serve this model (the message says why)."""


def attack_job(model: nn.Module, info: DatasetInfo, device: str, job: AuditJob,
               progress: str | None = None) -> AuditResult:
    """Run one job: the victim's replay of the update (the attacker's ``observation_for``) and
    the attack with its own budget. In the worker process, or inline (``progress``: show a
    progress bar with that label)."""
    from fedleak.attacks import create_attack
    from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
    from fedleak.harness.attacker.update_attack import observation_for

    started = time.perf_counter()
    try:
        observation = observation_for(model, job.params, job.buffers, job.received, info,
                                      device)
        attack = create_attack(job.attack, job.options)
        reconstruction = reconstruct_with_progress(attack, observation, device=device,
                                                   seed=job.seed, label=progress or "",
                                                   show=progress is not None)
    except Exception as err:  # recorded by the caller; the worker goes on
        return AuditResult(job.key, None, time.perf_counter() - started,
                           f"{type(err).__name__}: {err}")
    reconstruction.images = reconstruction.images.detach().cpu()
    reconstruction.labels = reconstruction.labels.detach().cpu()
    wall = time.perf_counter() - started
    if job.pictures is None or not reconstruction.has_images:
        return AuditResult(job.key, reconstruction, wall)
    save_reconstruction(job.pictures, denormalize(reconstruction.images, info).clamp(0, 1))
    return AuditResult(job.key, reconstruction, wall, drawn=True)


def lower_priority(base: int, nice: int, pid: int = 0) -> None:
    """Process ``pid`` (0: this one) at niceness ``base + nice``; past 19, the lowest niceness
    there is, also Linux's ``SCHED_IDLE`` policy (run only on cores nothing else wants:
    scheduler weight 3, against 15 at niceness 19 and 36 at Ray's +15), which a process may
    choose for itself and its owner's processes without privileges."""
    if not nice:
        return
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < min(19, base + nice):
            os.setpriority(os.PRIO_PROCESS, pid, min(19, base + nice))
        if base + nice > 19 and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # gone, or a kernel without SCHED_IDLE: the niceness is what is left
        pass


def _serve(info: DatasetInfo, device: str, nice: int, base: int, threads: int,
           jobs: Any, results: Any) -> None:
    """The worker process: lower its priority (:func:`lower_priority`), take the model (the
    first item), then attack jobs until ``None`` arrives."""
    lower_priority(base, nice)
    torch.set_num_threads(max(1, threads))
    model = pickle.loads(jobs.get())  # noqa: S301 - our own parent's pickle, not the wire
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            results.put(attack_job(model, info, device, job))
        except Exception:  # an unpicklable result: say so rather than hang the parent
            results.put(AuditResult(job.key, None, 0.0, traceback.format_exc(limit=2)))


class AuditWorker:
    """A niced worker process attacking :class:`AuditJob` s from a bounded queue (module doc).

    ``nice`` raises the worker's niceness over the federation's (:func:`federation_niceness`;
    0: same priority); ``threads`` is its torch threads; ``queue`` bounds the updates waiting
    or running.
    """

    def __init__(self, model: nn.Module, info: DatasetInfo, device: str = "cpu", *,
                 queue: int = DEFAULT_QUEUE, nice: int = DEFAULT_NICE, threads: int = 1
                 ) -> None:
        if queue < 1:
            raise ValueError(f"the audit's queue must hold at least 1 update, got {queue}")
        try:
            model_bytes = pickle.dumps(model)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise WorkerUnavailable(f"the model cannot travel to the audit's worker process "
                                    f"({type(err).__name__}: {err}); define its class at "
                                    "module level so it can be imported by name") from None
        context = multiprocessing.get_context("spawn")
        self.jobs, self.done = context.Queue(), context.Queue()
        # small arguments: the child imports torch while it reads them, and a parent writing
        # more than a pipe holds would wait for that; the model follows through the queue
        base = federation_niceness()
        self.process = context.Process(target=_serve, daemon=True, name="fedleak-audit",
                                       args=(info, device, nice, base, threads,
                                             self.jobs, self.done))
        self.process.start()
        self.jobs.put(model_bytes)  # a feeder thread writes it: no waiting here
        if self.process.pid:  # at once from here (the worker also lowers itself when it starts)
            lower_priority(base, nice, self.process.pid)
        self.limit, self.nice, self.threads = queue, nice, threads
        self.outstanding: set[tuple[int, int]] = set()

    def submit(self, job: AuditJob) -> int | None:
        """Queue ``job``; how many updates were ahead of it, or None when the queue was full
        (the job is skipped)."""
        if len(self.outstanding) >= self.limit:
            return None
        ahead = len(self.outstanding)
        self.outstanding.add(job.key)
        self.jobs.put(job)
        return ahead

    def results(self) -> list[AuditResult]:
        """The results that are in, without waiting."""
        out: list[AuditResult] = []
        while True:
            try:
                result = self.done.get_nowait()
            except queue.Empty:
                return out
            self.outstanding.discard(result.key)
            out.append(result)

    def drain(self, timeout: float | None = None) -> list[AuditResult]:
        """Every outstanding result, waiting for them (at most ``timeout`` s in all; None: as
        long as they take); a dead worker ends the wait with an error result per job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        while self.outstanding:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                break
            try:
                result = self.done.get(timeout=min(left or 5.0, 5.0))
            except queue.Empty:
                if not self.process.is_alive():
                    out += [AuditResult(key, None, 0.0, "the audit's worker process died "
                                        f"(exit code {self.process.exitcode})", lost=True)
                            for key in sorted(self.outstanding)]
                    self.outstanding.clear()
                continue
            self.outstanding.discard(result.key)
            out.append(result)
        return out

    def close(self, wait: bool = True) -> None:
        """Stop the worker: after the jobs already queued (``wait``), else at once."""
        if self.process.is_alive() and wait:
            self.jobs.put(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
