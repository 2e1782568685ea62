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
from typing import Protocol

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
