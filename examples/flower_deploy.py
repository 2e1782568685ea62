"""Run a Flower app on a real SuperLink and SuperNodes on loopback, and leave nothing behind.

docs/flower.md's ``flwr run`` recipe as one command that works:

    .venv/bin/python examples/flower_deploy.py examples/flower_app --nodes 2 \\
        --run-config 'out="/abs/path/runs/deploy" options="iterations=200 restarts=1"'

1. a temporary Flower home (``FLWR_HOME``) with a ``loopback`` SuperLink connection on a free
   port, and a real temporary state location (``--database`` a file in it: flwr 1.41 takes
   ``:flwr-in-memory-state:`` as a file name);
2. ``flower-superlink`` with runtime dependency installation off (flag and
   ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``), so ``flwr run`` never installs its own
   torch into a runtime environment: the app runs on this environment's packages;
3. waits until the SuperLink accepts connections on its port (``flwr run`` started before
   fails with "Connection to the SuperLink is unavailable"), then starts ``--nodes``
   SuperNodes (node ``i`` with ``--node-config 'partition-id=i num-partitions=N'``, plus
   ``--node-config-extra``: e.g. ``fedleak-allow-reveal=true``) and waits for theirs;
4. ``flwr run APP loopback --stream --run-config ...`` from the temporary folder, its output
   printed as it comes, retrying while the SuperLink is not yet serving; past ``--timeout``
   it is stopped with a message naming ``--timeout``;
5. reads the audit's report (``metrics.json`` in the run config's ``out``, else the app's
   ``[tool.flwr.app.config]`` ``out``): a report whose ``status`` is not ``finished`` is said
   with its reason (a ServerApp Flower stopped, a node that never answered the score query,
   the audit's worker killed, a report still ``running``: the ServerApp was killed before it
   could write) and the script exits 3; it says when Flower restarted a ClientApp in a loop
   (``Runtime task-token authentication failed`` in a SuperNode's log: the ClientApp took
   longer to start than Flower's token lasts);
6. stops every process it started *and their descendants* — the SuperLink starts
   ``flower-superexec`` in a new session, which ``kill %1`` never reaches — found by a marker
   in their environment (``FEDLEAK_FLOWER_DEPLOY``, inherited by every child), SIGTERM then
   SIGKILL, and removes the temporary folder (``--keep`` keeps it, with the logs). Ctrl-C,
   SIGTERM (what ``timeout``, CI and ``kill`` send) and SIGHUP (a closed terminal) do the
   same, after saying which phase the script and each of its processes are in; it then exits
   128 + the signal's number.

Exits with ``flwr run``'s status (1 when it could not start), 3 when the audit's report is
not ``finished``. Linux (reads /proc). The ServerApp runs in a process the SuperLink starts:
give absolute paths in the run config.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import uuid
from pathlib import Path
from types import FrameType

MARKER = "FEDLEAK_FLOWER_DEPLOY"
#: the exit status when the audit's report is not ``finished``
REPORT_NOT_FINISHED = 3
#: what a SuperNode's log says when Flower restarts a ClientApp whose start outlived its token
RESTART_SIGN = "task-token authentication failed"
#: the signals that stop the deployment like Ctrl-C does
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A stop signal arrived (SIGTERM, SIGHUP): stop everything, as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], seconds: float) -> None:
    """Until 127.0.0.1:``port`` accepts a connection; RuntimeError if ``process`` dies first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode} before it "
                               f"listened on port {port} (see its log)")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port} after {seconds:g} s")


def marked(token: str) -> list[int]:
    """Every process of this user whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return found


def stop_all(token: str, started: list[subprocess.Popen[bytes]], grace: float = 10.0) -> list[int]:
    """SIGTERM every marked process (the ones started and all their descendants), wait up to
    ``grace`` s, SIGKILL what is left; returns the pids still alive after that (none)."""
    for process in started:
        if process.poll() is None:
            process.terminate()
    for pid in marked(token):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (marked(token) or
                                           any(p.poll() is None for p in started)):
        time.sleep(0.2)
    for pid in marked(token):
        _signal(pid, signal.SIGKILL)
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and marked(token):
        time.sleep(0.1)
    return marked(token)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stream(command: list[str], env: dict[str, str], cwd: Path, deadline: float,
           timeout: float) -> tuple[int, str]:
    """Run ``command``, printing its output as it comes; (exit status, the output). Past
    ``deadline`` it is stopped: RuntimeError naming ``--timeout``."""
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise RuntimeError(f"flwr run did not finish within --timeout {timeout:g} s (the "
                           "audit finishes after the federation's last round): raise "
                           "--timeout") from None
    reader.join(timeout=10)
    return process.returncode, "".join(lines)


def run_config_out(run_config: str, app: Path) -> Path | None:
    """The audit's ``out`` folder: the ``--run-config`` value (parsed as ``flwr run`` parses
    it: ``key=value`` pairs, TOML values), else the app's ``[tool.flwr.app.config]`` one;
    None when neither names an absolute folder."""
    pairs = re.findall(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)", run_config)
    value: object = None
    try:
        value = tomllib.loads("\n".join(f"{k} = {v}" for k, v in pairs)).get("out")
        if value is None:
            project = tomllib.loads((app / "pyproject.toml").read_text())
            value = project.get("tool", {}).get("flwr", {}).get("app", {}).get(
                "config", {}).get("out")
    except (tomllib.TOMLDecodeError, OSError):
        return None
    return Path(value) if isinstance(value, str) and Path(value).is_absolute() else None


def report_problem(out: Path | None) -> str | None:
    """What is wrong with the audit's report in ``out`` (None: ``finished``, or no ``out``)."""
    if out is None:
        return None
    path = out / "metrics.json"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        return f"the audit wrote no report ({path} does not exist)"
    except (OSError, ValueError) as err:
        return f"the audit's report {path} cannot be read: {err}"
    status = report.get("status")
    if status == "finished":
        return None
    if status == "running":
        phase = report.get("phase") or "an unknown phase"
        return (f"the audit's report {path} still says status 'running' (phase: {phase}): the "
                "ServerApp ended before the audit could write how it ended (killed?)")
    return f"the audit's report {path} says status {status!r}: {report.get('status_reason')}"


def restart_loops(work: Path, nodes: int) -> list[str]:
    """One line per SuperNode whose log shows Flower restarting its ClientApp because the
    ClientApp's start outlived its task token."""
    out = []
    for i in range(nodes):
        try:
            log = (work / f"node{i}.log").read_text(errors="replace")
        except OSError:
            continue
        failed = log.count(RESTART_SIGN)
        if failed:
            starts = log.count("Start `flwr-clientapp` process")
            received = len(re.findall(r"Receiving: \w+ message", log))
            out.append(f"SuperNode {i}: Flower restarted its ClientApp ({starts} starts for "
                       f"{received} messages; 'Runtime {RESTART_SIGN}' {failed} times): the "
                       "ClientApp took longer to start than its task token lasts (30 s) — "
                       "import less at its module level, or run on a less loaded machine")
    return out


def describe(pids: list[int], started: dict[int, str], phase: str, out: Path | None) -> list[str]:
    """Which phase the script and each of its processes are in, one line each."""
    audit = None
    if out is not None:
        try:
            audit = json.loads((out / "metrics.json").read_text()).get("phase")
        except (OSError, ValueError):
            audit = None
    lines = [f"flower_deploy.py was {phase}"]
    for pid in sorted(pids):
        role = started.get(pid) or _role(pid)
        if role == "flwr-serverapp" and audit:
            role += f" (the audit: {audit})"
        lines.append(f"  pid {pid}: {role}, running {_age(pid)}")
    return lines


def _role(pid: int) -> str:
    """What a marked process is, from its command line."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        parent = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1]
                     .split()[1])
        parent_argv = (Path("/proc") / str(parent) / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return "gone"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    for name in ("flwr-serverapp", "flwr-clientapp", "flower-superexec", "flower-supernode",
                 "flower-superlink"):
        if name in text:
            return name
    if b"flwr-serverapp" in parent_argv and "resource_tracker" in text:
        return "multiprocessing's resource tracker (a child of flwr-serverapp)"
    if b"flwr-serverapp" in parent_argv and "multiprocessing" in text:
        return "the audit's worker (a child of flwr-serverapp)"
    if "flwr run" in text or (len(argv) > 2 and argv[1].endswith(b"flwr") and argv[2] == b"run"):
        return "flwr run (streaming the run's log)"
    return text[:80]


def _age(pid: int) -> str:
    try:
        ticks = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = float(Path("/proc/uptime").read_text().split()[0])
        return f"{boot - ticks / os.sysconf('SC_CLK_TCK'):.0f} s"
    except (OSError, ValueError, IndexError):
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", type=Path, help="the Flower app folder (its pyproject.toml)")
    parser.add_argument("--nodes", type=int, default=2, help="SuperNodes to start")
    parser.add_argument("--run-config", default="", help="flwr run --run-config overrides")
    parser.add_argument("--node-config-extra", default="",
                        help="added to every SuperNode's --node-config (key=value ...)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds flwr run may take, the audit after the last round "
                             "included")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folder (Flower home, state, logs)")
    args = parser.parse_args()
    if not Path("/proc").is_dir():
        print("flower_deploy.py reads /proc to stop every process it started: Linux only",
              file=sys.stderr)
        return 1
    bin_dir = Path(sys.executable).parent
    app = args.app.resolve()
    token = os.environ.get(MARKER) or uuid.uuid4().hex  # a caller's own marker, if set
    work = Path(tempfile.mkdtemp(prefix=f"fedleak-flower-{token[:12]}-"))
    link = free_port()
    home = work / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n[superlink.loopback]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), MARKER: token,
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    started: list[subprocess.Popen[bytes]] = []
    names: dict[int, str] = {}
    logs = []
    phase = "starting"

    def start(name: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed at the end
        logs.append(log)
        process = subprocess.Popen(command, env=env, cwd=work, stdout=log,
                                   stderr=subprocess.STDOUT)
        started.append(process)
        names[process.pid] = name
        return process

    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    out = run_config_out(args.run_config, app)
    status, stopped = 1, False
    try:
        phase = "starting the SuperLink"
        superlink = start("superlink", [
            str(bin_dir / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
            "--port", str(link), "--database", str(work / "state.db"),
            "--disable-runtime-dependency-installation"])
        wait_listening(link, superlink, 60)
        for i in range(args.nodes):
            phase = f"starting SuperNode {i} of {args.nodes}"
            port = free_port()
            node = start(f"node{i}", [
                str(bin_dir / "flower-supernode"), "--insecure", "--superlink",
                f"127.0.0.1:{link}", "--host", "127.0.0.1", "--port", str(port),
                "--node-config",
                f"partition-id={i} num-partitions={args.nodes} {args.node_config_extra}".strip()])
            wait_listening(port, node, 60)
        command = [str(bin_dir / "flwr"), "run", str(app), "loopback", "--stream"]
        if args.run_config:
            command += ["--run-config", args.run_config]
        deadline = time.monotonic() + args.timeout
        phase = "running the app (flwr run)"
        for attempt in range(10):
            status, output = stream(command, env, work, deadline, args.timeout)
            if "unavailable" not in output.lower() or attempt == 9:
                break
            time.sleep(1)  # listening, not yet serving: try again
        phase = "reading the audit's report"
        problem = report_problem(out)
        if problem:
            print(f"flower_deploy.py: {problem}", file=sys.stderr)
            status = status or REPORT_NOT_FINISHED
    except RuntimeError as err:
        print(f"flower_deploy.py: {err}", file=sys.stderr)
        status = 1
    except (Stopped, KeyboardInterrupt) as err:
        name = err.args[0] if isinstance(err, Stopped) else "SIGINT (Ctrl-C)"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the stop
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        print(f"flower_deploy.py: {name}: stopping every process it started", file=sys.stderr)
        for line in describe(marked(token), names, phase, out):
            print(line, file=sys.stderr)
        status = 128 + (err.signum if isinstance(err, Stopped) else signal.SIGINT)
        stopped = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        left = stop_all(token, started)
        for log in logs:
            log.close()
        problem = report_problem(out) if stopped else None
        if problem:  # what the ServerApp wrote when it was stopped
            print(f"flower_deploy.py: {problem}", file=sys.stderr)
        for line in restart_loops(work, args.nodes):
            print(f"flower_deploy.py: {line}", file=sys.stderr)
        if left:
            print(f"flower_deploy.py: processes {left} would not stop", file=sys.stderr)
            status = status or 1
        if args.keep:
            print(f"kept {work} (Flower home, state, logs)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
