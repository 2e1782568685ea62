"""Run ``fedleak victim serve`` as a child process on a free loopback port.

Used by ``fedleak demo``, sweeps and the integration tests: the victim is a real separate
process; this only starts it, reads the address it bound, and stops it with SIGTERM. A victim
is described by :class:`~fedleak.harness.victim.settings.VictimSettings`, handed to the child
as a JSON file (``--settings``), or, for tests of the CLI itself, by ``victim serve`` options.
The child is told this process's pid (``FEDLEAK_PARENT_PID``) and asks Linux to stop it when
this process — strictly, the thread that started it — dies (``wire.serving.die_with_parent``),
so a parent killed with SIGKILL leaves no victim behind; start victims from a thread that
lives as long as they should. Children run with ``python -P`` and an absolute ``PYTHONPATH``,
so code planted in the working directory is never imported.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedleak.harness.victim.settings import VictimSettings
from fedleak.harness.wire.serving import PARENT_PID_ENV

_READY = re.compile(r"listening on (\S+:\d+)")
#: The fedleak command for child processes. ``-P`` keeps the working directory off
#: ``sys.path`` (``-m`` would put it first): a victim started from a folder holding a planted
#: ``torch.py`` or ``fedleak/`` must not import it. Installed plug-ins (entry points) and
#: ``PYTHONPATH`` still work.
FEDLEAK_COMMAND = (sys.executable, "-P", "-m", "fedleak")


def safe_python_path(value: str) -> str:
    """``PYTHONPATH`` for a child: each entry made absolute against this working directory, and
    empty entries (which mean "the working directory") dropped."""
    return os.pathsep.join(os.path.abspath(entry) for entry in value.split(os.pathsep) if entry)
class VictimProcessError(RuntimeError):
    """The victim process exited or did not report its address in time."""


class VictimProcess:
    """Context manager: start the victim described by ``settings`` (or by ``victim serve``
    options), stop it after.

    ``command`` runs another server that prints ``listening on HOST:PORT`` and takes ``--host``
    and ``--port`` instead (e.g. ``fedleak defense serve``); ``env`` adds environment variables.
    """

    def __init__(self, settings: VictimSettings | Sequence[str], token: str | None = None,
                 start_timeout: float = 900.0, command: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.settings = settings if isinstance(settings, VictimSettings) else None
        self.args = [] if isinstance(settings, VictimSettings) else list(settings)
        self._settings_file: Path | None = None
        self.token = token
        self.start_timeout = start_timeout
        self.command = list(command or [*FEDLEAK_COMMAND, "victim", "serve"])
        self.extra_env = dict(env or {})
        self.address = ""
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: deque[str] = deque(maxlen=50)

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> VictimProcess:
        env = {**os.environ, **self.extra_env}
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = safe_python_path(env["PYTHONPATH"])
        if self.token:
            env["FEDLEAK_TOKEN"] = self.token
        args = self.args
        if self.settings is not None:
            handle, name = tempfile.mkstemp(prefix="fedleak-victim-", suffix=".json")
            with os.fdopen(handle, "w") as file:
                file.write(self.settings.to_json())
            self._settings_file = Path(name)
            args = ["--settings", name]
        command = [*self.command, "--host", "127.0.0.1", "--port", "0", *args]
        env[PARENT_PID_ENV] = str(os.getpid())  # the child dies with us (die_with_parent)
        self._proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        found = threading.Event()
        threading.Thread(target=self._read_address, args=(found,), daemon=True).start()
        if not found.wait(self.start_timeout) or not self.address:
            self.stop()
            raise VictimProcessError(
                "the victim process did not start: " + ("".join(self._stderr)[-2000:] or
                                                        "no output")
            )
        return self

    def _read_address(self, found: threading.Event) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            match = _READY.search(line)
            if match:
                self.address = match.group(1)
                found.set()
        found.set()  # stdout closed: the process ended

    def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    def stderr_tail(self) -> str:
        return "".join(self._stderr)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait for a graceful shutdown, SIGKILL if it hangs; returns the exit code."""
        if self._settings_file is not None:
            self._settings_file.unlink(missing_ok=True)
            self._settings_file = None
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self) -> VictimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
