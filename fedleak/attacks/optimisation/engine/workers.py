"""Restarts split across worker processes (``-o workers=N``): both cores at work on tiny ops.

The R restarts of a first-order attack are independent: restart r starts from ``seed + r`` and
its objective depends on its own iterate alone (:mod:`fedleak.attacks.optimisation.restarts`).
With ``workers=N > 1`` on the CPU they are cut into N contiguous chunks (restarts
``start … start + k − 1``); each chunk runs in a worker process, one intra-op thread, as the same
attack with ``restarts=k`` from ``seed + start``, so restart r is seeded by its index whichever
process runs it. The parent gathers every chunk's per-restart final values and keeps the lowest,
first index on ties, exactly as one process does over all R.

How the workers start. A process that holds a gRPC channel (the attacker of ``fedleak attack``)
must not fork: gRPC's own threads hold its state mid-call, and a child forked from them crashes
before running a line of Python (measured: 15 of 17 CLI runs with ``workers=2`` lost a worker
that way, 2026-12-03). So the job — the attack, the observation (its model and replay), the
parts — is pickled once and sent to workers started by a fork server, a clean process launched
for the purpose, with torch and this module preloaded. A job that does not pickle (a user's
replay holding a closure) is forked as before where no gRPC is loaded, and otherwise runs in the
one process with a warning saying why. Only the chunk index and the pickled job go out; a
:class:`~fedleak.attacks.observation.Reconstruction` comes back.

Not split (run in the one process): one restart, L-BFGS, priors that couple restarts, devices
other than the CPU, platforms without ``fork``. A worker that dies (killed, out of memory) is
reported as a :class:`WorkerError` naming the chunk.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from fedleak.attacks.observation import Observation, Reconstruction

_JOB: dict[str, Any] = {}


class WorkerError(RuntimeError):
    """A restart worker process died before returning its chunk."""


def chunks(restarts: int, workers: int) -> list[tuple[int, int]]:
    """Cut ``restarts`` into at most ``workers`` contiguous ``(start, count)`` chunks.

    Parameters
    ----------
    restarts : int
        R, the restarts of the attack.
    workers : int
        N, the processes asked for.

    Returns
    -------
    list of tuple of int
        ``(start, count)`` per chunk, sizes differing by at most one, earlier ones larger.
    """
    n = max(1, min(workers, restarts))
    base, extra = divmod(restarts, n)
    out, start = [], 0
    for i in range(n):
        count = base + (1 if i < extra else 0)
        out.append((start, count))
        start += count
    return out


def splits(attack: Any, device: torch.device) -> bool:
    """Whether ``attack``'s restarts go to worker processes on ``device``.

    Parameters
    ----------
    attack : ComposedInversion
        The attack, its config holding ``workers`` and ``restarts``.
    device : torch.device
        Where the attack computes.

    Returns
    -------
    bool
        True when ``workers > 1``, ``restarts > 1``, a first-order optimiser, no coupling prior,
        the CPU and ``fork`` available.
    """
    cfg = attack.config
    return (cfg.workers > 1 and cfg.restarts > 1 and device.type == "cpu"
            and attack.optimiser_part().first_order
            and not any(p.coupled for p in attack.prior_parts())
            and "fork" in multiprocessing.get_all_start_methods())


def run_chunk(index: int) -> Reconstruction:
    """Run chunk ``index`` of the job the parent set up before forking (one thread)."""
    torch.set_num_threads(1)
    job = _JOB
    start, count = job["chunks"][index]
    attack = job["attack"]
    sub = type(attack)(dataclasses.replace(attack.config, restarts=count, workers=1))
    torch.manual_seed(job["seed"] + start)
    result: Reconstruction = sub.recover_with(job["observation"], job["parts"],
                                              device=job["device"], seed=job["seed"] + start,
                                              progress=None)
    return result


def run_pickled_chunk(payload: bytes, index: int) -> Reconstruction:
    """Run chunk ``index`` of the pickled job ``payload`` (a fork server's worker)."""
    _JOB.clear()
    _JOB.update(pickle.loads(payload))
    try:
        return run_chunk(index)
    finally:
        _JOB.clear()


def pickled_job(job: dict[str, Any]) -> bytes | None:
    """``job`` pickled for a fork server's workers, or None where it does not pickle."""
    try:
        return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001  (any pickling failure: a closure, a lock, a C object)
        return None


def start_method(payload: bytes | None) -> str | None:
    """How the workers start (module docstring).

    ``forkserver`` for a job that pickles, ``fork`` where it does not and no gRPC is loaded,
    None (one process) otherwise.
    """
    methods = multiprocessing.get_all_start_methods()
    if payload is not None and "forkserver" in methods:
        return "forkserver"
    if "grpc" not in sys.modules and "fork" in methods:
        return "fork"
    return None


def recover_in_workers(attack: Any, observation: Observation, parts: Any,
                       device: torch.device, seed: int, progress: Any) -> Reconstruction:
    """Run ``attack``'s restarts in ``workers`` worker processes and keep the best.

    Parameters
    ----------
    attack : ComposedInversion
        The attack (``workers > 1``, see :func:`splits`).
    observation : Observation
        The observed round.
    parts : Parts
        The objective and replay parts chosen for ``observation``.
    device : torch.device
        The CPU.
    seed : int
        Restart r starts from ``seed + r``.
    progress : Progress or None
        Told once per finished chunk.

    Returns
    -------
    Reconstruction
        The best restart over all chunks, ``restart_objectives`` in restart order.

    Raises
    ------
    WorkerError
        When a worker process dies before returning its chunk.
    """
    cfg = attack.config
    parts_of = chunks(cfg.restarts, cfg.workers)
    job = dict(attack=attack, observation=observation, parts=parts, device=device, seed=seed,
               chunks=parts_of)
    payload = pickled_job(job)
    method = start_method(payload)
    if method is None:
        alone = type(attack)(dataclasses.replace(cfg, workers=1))
        result: Reconstruction = alone.recover_with(observation, parts, device=device,
                                                    seed=seed, progress=progress)
        return dataclasses.replace(result, warnings=sorted({*result.warnings, (
            f"workers={cfg.workers} not used: the observation does not pickle for a fork "
            "server's workers and this process holds gRPC, which a fork would crash; the "
            "restarts ran in one process")}))
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        assert payload is not None
        context.set_forkserver_preload([__name__])
    else:
        _JOB.update(job)
    results: list[Reconstruction] = []
    done, total = 0, cfg.iterations * cfg.restarts
    try:
        with ProcessPoolExecutor(max_workers=len(parts_of), mp_context=context) as pool:
            futures = [pool.submit(run_chunk, i) if payload is None else
                       pool.submit(run_pickled_chunk, payload, i) for i in range(len(parts_of))]
            for i, future in enumerate(futures):
                try:
                    results.append(future.result())
                except BrokenProcessPool as err:
                    start, count = parts_of[i]
                    raise WorkerError(
                        f"restart worker for restarts {start}..{start + count - 1} died "
                        f"(killed or out of memory?) before returning; rerun with -o workers=1 "
                        f"to attack in one process") from err
                done += parts_of[i][1] * cfg.iterations
                if progress is not None:
                    progress(done, total, float(min(results[-1].restart_objectives)))
    finally:
        _JOB.clear()
    finals = [v for r in results for v in r.restart_objectives]
    best = min(range(len(finals)), key=finals.__getitem__)
    owner = next(i for i, (s, c) in enumerate(parts_of) if s <= best < s + c)
    chosen = results[owner]
    extras = dict(chosen.extras)
    extras["workers"] = len(parts_of)
    return dataclasses.replace(
        chosen, objective=finals[best], iterations=total, restart_objectives=finals,
        extras=extras, warnings=sorted({w for r in results for w in r.warnings}))
