"""How an audit ends: its report says so whatever ends the ServerApp.

A deployed ServerApp can end in more ways than its last line: Flower stops it on a signal —
SIGTERM or SIGQUIT from whoever runs it, or the SIGINT Flower raises itself when the SuperLink
no longer acknowledges the ServerApp's heartbeat (the SuperLink then holds the task as
expired) — by running its exit handlers and ``sys.exit`` (status 0: a "graceful exit"), with a
forced ``os._exit`` five seconds later; a KeyboardInterrupt; an exception; or a ServerApp that
drives the rounds itself and never calls ``finish()``. Before this module an audit that was
waiting for its worker when Flower stopped the ServerApp left ``metrics.json`` at ``status:
"running"``, every round "pending", and the exit status 0.

- :func:`ended_by` turns what ended the run into a ``status`` and its ``reason``:
  ``stopped`` (Flower's exit on a signal, ``SystemExit``), ``interrupted``
  (``KeyboardInterrupt``), ``failed`` (any other exception), each with the phase the audit was
  in;
- :class:`AuditEnd` (what :class:`~fedleak.harness.flower.auditor.Auditor` ends with):
  ``finish`` waits for the worker, has the nodes score, and writes ``finished`` or
  ``incomplete``; ``end_now`` writes a stop's status at once, before anything that could wait;
- :func:`watch` registers the audit's last word twice: as a Flower exit handler that runs
  before Flower closes the ServerApp's grid and before its forced exit (the report is written
  within Flower's five seconds, the worker stopped), and with ``atexit`` for a process that
  ends without ``finish()`` (status ``unfinished``). Each does nothing once the audit has
  ended.

The statuses a finished federation's report can have are ``finished`` (every attacked update
scored, or scoring off) and ``incomplete`` (the reason names what is missing: a node that never
answered the score query, the worker killed, updates still queued past ``drain_timeout``).
``examples/flower_deploy.py`` exits non-zero for any status but ``finished``.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fedleak.harness.attacker.records import METRICS_NAME, UpdateRun
from fedleak.harness.metrics.floors import NOTHING_RECOVERED

#: the report's statuses (``metrics.json``'s ``status``)
FINISHED, INCOMPLETE, STOPPED = "finished", "incomplete", "stopped"
INTERRUPTED, FAILED, UNFINISHED = "interrupted", "failed", "unfinished"


class Ending(Protocol):
    """What :func:`watch` needs of an audit: whether it ended, and how to end it now."""

    ended: bool

    def end_now(self, status: str, reason: str) -> None:
        """Write ``status`` and ``reason`` at once and stop the worker, waiting for nothing."""


def stopped(phase: str) -> str:
    """The reason of a ServerApp Flower stopped while the audit was in ``phase``."""
    return (f"the ServerApp was stopped while {phase} (Flower's exit on a signal: SIGTERM or "
            "SIGQUIT from whoever runs it, or the SIGINT Flower raises when the SuperLink no "
            "longer acknowledges the ServerApp's heartbeat)")


def ended_by(err: BaseException, phase: str) -> tuple[str, str]:
    """The status and reason for a run that ``err`` ended while the audit was in ``phase``."""
    if isinstance(err, SystemExit):
        return STOPPED, stopped(phase)
    if isinstance(err, KeyboardInterrupt):
        return INTERRUPTED, f"interrupted (Ctrl-C) while {phase}"
    return FAILED, f"{type(err).__name__} while {phase}: {err}"


def watch(audit: Ending, phase: Callable[[], str]) -> None:
    """Register ``audit``'s last word (module docstring); held weakly, so an audit that is
    gone is not kept alive by it."""
    ref = weakref.ref(audit)

    def on_flower_exit() -> None:
        held = ref()
        if held is not None and not held.ended:
            held.end_now(STOPPED, stopped(phase()))

    def at_exit() -> None:
        held = ref()
        if held is not None and not held.ended:
            held.end_now(UNFINISHED, f"the ServerApp's process ended while {phase()}, before "
                                     "the audit finished (a ServerApp that drives the rounds "
                                     "itself calls strategy.finish() at the end)")

    try:
        from flwr.supercore.exit import add_exit_handler
    except ImportError:  # a Flower without it: atexit alone
        pass
    else:
        add_exit_handler(on_flower_exit, run_before_force_exit=True)
    atexit.register(at_exit)


class AuditEnd:
    """How an :class:`~fedleak.harness.flower.auditor.Auditor` ends (module docstring); the
    attributes below are the auditor's."""

    run: UpdateRun
    out: Path
    log: Callable[[str], None]
    score: bool
    drain_timeout: float | None
    ended: bool
    phase: str
    _worker: Any
    _pending: dict[Any, Any]
    _to_score: list[Any]
    _missing: list[str]

    def _complete(self, result: Any) -> Any:
        raise NotImplementedError

    def _score_pending(self) -> None:
        raise NotImplementedError

    def _not_attacked(self, where: str, reason: str) -> None:
        raise NotImplementedError

    def finish(self, status: str = FINISHED, reason: str | None = None) -> UpdateRun:
        """Wait for the attacks still running (the worker), have the nodes score them, and
        record how the audit ended in ``metrics.json``; returns the run.
        ``LeakageAudit.start`` calls it; a ServerApp that drives the strategy round by round
        itself calls it at the end (else :mod:`~fedleak.harness.flower.audit_end` records
        ``unfinished`` when its process ends).

        ``status``: ``finished`` (the federation ended: wait, score, then ``finished`` or
        ``incomplete`` with what is missing), or how it stopped early (``interrupted``,
        ``stopped``, ``failed``, with ``reason``), which is written at once — before anything
        that could wait — and nothing is scored. Whatever happens meanwhile (an error, a signal
        Flower turns into ``SystemExit``), ``metrics.json`` ends with a status and its reason.
        """
        if self.ended:
            return self.run
        if status != FINISHED:
            self.end_now(status, reason or f"the federation ended: {status}")
            return self.run
        try:
            self._drain()
            self._set_phase("the nodes score the attacked updates")
            self._score_pending()
            self._after_federation()
        except BaseException as err:
            self.end_now(*ended_by(err, self.phase))
            if not isinstance(err, Exception):
                raise
            self.log(f"warning: the audit failed: {err}")
            return self.run
        self._end(*self._completeness())
        return self.run

    def _after_federation(self) -> None:
        """What a wrapper does once the honest updates are scored (LeakageAudit: its probe)."""

    def end_now(self, status: str, reason: str) -> None:
        """End the audit at once with ``status`` and ``reason``: the rounds still pending are
        recorded unscored or not attacked with that reason, the report is written, the worker
        stopped (:mod:`~fedleak.harness.flower.audit_end`: within Flower's five seconds)."""
        if self.ended:
            return
        for pending in list(self._pending.values()):
            self.run.warnings.append(f"round {pending.server_round}, {pending.label}: not "
                                     f"attacked: the audit ended ({status}) first")
        self._pending.clear()
        for _, entry, _, _, _ in self._to_score:
            entry.unscored = f"not scored: the audit ended ({status}) before the nodes scored"
        self._to_score = []
        self._end(status, reason)
        if self._worker is not None:
            self._worker.close(wait=False)

    def _drain(self) -> None:
        """The worker's remaining results (waiting at most ``drain_timeout``), recorded."""
        if self._worker is None:
            return
        if self._pending:
            self._set_phase(f"attacking {len(self._pending)} queued update(s) after the "
                            "federation")
            self.log(f"the audit attacks {len(self._pending)} update(s) still queued, "
                     "after the federation")
        for result in self._worker.drain(self.drain_timeout):
            self._complete(result)
            if self._pending:
                self._set_phase(f"attacking {len(self._pending)} queued update(s) after the "
                                "federation")
        self._worker.close(wait=True)
        for pending in list(self._pending.values()):
            why = (f"still queued after {self.drain_timeout} s (drain_timeout) when the "
                   "federation ended")
            self._missing.append(f"round {pending.server_round}, {pending.label}: {why}")
            self._not_attacked(f"round {pending.server_round}, {pending.label}", why)
        self._pending.clear()

    def _completeness(self) -> tuple[str, str | None]:
        """``finished``, or ``incomplete`` with what the report misses: updates the worker
        never attacked (killed, or still queued), rounds the nodes did not score."""
        missing = list(self._missing)
        if self.score:
            missing += [f"{getattr(r, 'node', None) or r.round_id}: {r.unscored}"
                        for r in self.run.rounds  # image and text rounds alike
                        if r.unscored and not getattr(r, "images", None)]
        if not missing:
            return FINISHED, None
        return INCOMPLETE, (f"{len(missing)} update(s) attacked or recorded without a score: "
                            + "; ".join(missing[:4]) + ("; ..." if len(missing) > 4 else ""))

    def _end(self, status: str, reason: str | None) -> None:
        """Write how the audit ended and say it in one line (the summary lines with it)."""
        self.ended = True
        self.run.status, self.run.status_reason, self.run.phase = status, reason, None
        self.run.write(self.out)
        for line in self.run.summary_lines(self.out):
            if line.startswith(("mean PSNR", "LOWER BOUND", "inexact", NOTHING_RECOVERED)) \
                    or " above their floor " in line:
                self.log(line)
        self.log(f"audit {status}: {len(self.run.rounds)} update(s) recorded in "
                 f"{self.out / METRICS_NAME}"
                 + (f" ({reason})" if reason else ""))

    def _set_phase(self, phase: str) -> None:
        """What the audit is doing now, in ``metrics.json`` while it runs (``phase``)."""
        self.phase = phase
        if not self.ended:
            self.run.phase = phase
            self.run.write(self.out)
