"""Build an in-process :class:`Observation` through the harness's entry point
(:func:`fedleak.harness.federated.observe.observe`), with a model from the zoo. Images are
given on [0, 1] and normalised with ``mean``/``std`` (the same value for every channel; 0.5/0.5
maps [0, 1] to [−1, 1], 0/1 is the identity).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from fedleak.attacks.observation import Observation
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.zoo.datasets import DatasetInfo, load_dataset, normalize
from fedleak.harness.zoo.models import build_model


def make_observation(
    model_name: str,
    shape: tuple[int, int, int],
    num_classes: int,
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: Protocol = Protocol(),  # noqa: B008  (frozen dataclass, immutable)
    *,
    mean: float = 0.5,
    std: float = 0.5,
    seed: int = 0,
    device: torch.device | str = "cpu",
    give_labels: bool = False,
) -> Observation:
    """The server's view of one round in which the user trained on ``images`` ([0, 1]).

    The model is built after ``torch.manual_seed(seed)``; ``give_labels`` puts the true labels
    into the observation (a threat model where they are known).
    """
    torch.manual_seed(seed)
    model = build_model(model_name, shape, num_classes).to(device)
    info = DatasetInfo("test", shape, num_classes, (mean,) * shape[0], (std,) * shape[0], ())
    return observe(model, images, labels, info, protocol, give_labels=give_labels)


def to_unit(observation: Observation, images: torch.Tensor) -> torch.Tensor:
    """Undo the observation's normalisation: images in normalised space back onto [0, 1]."""
    mean = torch.as_tensor(observation.mean, device=images.device).view(1, -1, 1, 1)
    std = torch.as_tensor(observation.std, device=images.device).view(1, -1, 1, 1)
    return images * std + mean


def revealed_clean_update(
    client: VictimClient, round_id: str, parameters: dict, buffers: dict, model_name: str,
    dataset: str = "digits", protocol: Protocol = Protocol(),  # noqa: B008  (frozen dataclass)
) -> list[torch.Tensor]:
    """The undefended update of a victim's round, recomputed from its revealed private batch.

    The victim must run ``model_name`` on ``dataset`` (split ``all``) with ``--allow-reveal``.
    """
    truth, labels = client.reveal(round_id)
    info = load_dataset(dataset, "all").info
    model = build_model(model_name, info.shape, info.num_classes)
    return local_update(model, parameters, buffers, normalize(truth, info), labels, protocol)


def tiny_spec(defenses: str, iterations: int = 10, utility_rounds: int = 3,
              rounds: int = 1, name: str = "tiny") -> str:
    """A sweep spec small enough for tests: digits, a 16-wide MLP, the no-defense point first,
    then ``defenses`` (``[[sweep.defense]]`` tables as TOML text)."""
    return f"""
[sweep]
name = "{name}"
dataset = "digits"
models = ["mlp:width=16,depth=1"]
rounds = {rounds}
batch_size = 1

[[sweep.attack]]
name = "inverting-gradients"
iterations = {iterations}

[sweep.utility]
rounds = {utility_rounds}
batch_size = 4

[[sweep.defense]]
reference = true
{defenses}
"""


def load_bench_script(name: str) -> ModuleType:
    """Import ``bench/NAME.py`` (an experiment script, not part of the library) as a module."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def self_signed_certificate(directory: Path, host: str = "127.0.0.1",
                            name: str = "victim") -> tuple[Path, Path]:
    """A fresh self-signed PEM certificate for ``host`` (its IP in the SAN) and its key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def listening_sockets(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, host, port) of every TCP socket in LISTEN state held by one of ``pids`` (Linux,
    read from ``/proc``; processes that ended meanwhile are skipped)."""
    from fedleak.harness.wire.connections import tcp_address

    listening: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in list(file)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    listening[int(fields[9])] = tcp_address(fields[1])
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in listening:
                found.append((pid, *listening[int(target[8:-1])]))
    return found


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (Linux, from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, []))
    return found


# What makes a float figure nearly the same on every x86-64 CPU: ATen's kernels compiled for the
# baseline instruction set (no AVX2/AVX-512 dispatch), MKL's conditional numerical
# reproducibility, one thread, and no oneDNN (convolutions through ATen + MKL). Pinned figures
# are measured under these settings, which keeps them close across machines (the default
# kernels differ in the last bits between CPUs, and an attack's iterations amplify that); they
# are still compared with FIGURE_RTOL, never bit for bit.
PORTABLE_NUMERICS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: Relative tolerance of pinned attack figures. Even under PORTABLE_NUMERICS the last float32
#: bits differ between CPUs (libm, MKL), and iterations amplify them; bench/portable_figures.py
#: measured the figures moving by at most 2.9e-5 across ATen's default/AVX2/AVX-512 kernels and
#: MKL's modes, and a 1 % change of an attack's learning rate moving them by 3.9e-3 or more: 2e-4
#: passes on any x86-64 CPU and still fails on a change of behaviour
#: (tests/attacks/optimisation/test_presets.py).
FIGURE_RTOL = 2e-4
#: Names a QEMU CPU model (``EPYC-Rome-v2``, ``Haswell``, ...) to run the portable child under
#: ``qemu-x86_64 -cpu MODEL``: the pinned-figure tests as on that CPU, whose CPUID (vendor,
#: AVX-512 or not) decides MKL's, oneDNN's and ATen's kernels (bench/portable_figures.py --cpu).
#: The emulated child runs about 8 times slower than natively: add ``-o timeout=0`` to pytest.
PORTABLE_CPU_VARIABLE = "FEDLEAK_PORTABLE_CPU"


def emulator(model: str | None) -> list[str]:
    """The command prefix that runs a program as on CPU ``model`` (QEMU's user-mode emulator,
    Debian's ``qemu-user``); empty without a model."""
    if not model:
        return []
    if shutil.which("qemu-x86_64") is None:
        raise RuntimeError(f"CPU model {model!r} asked for, but qemu-x86_64 is not installed "
                           "(apt-get install qemu-user)")
    return ["qemu-x86_64", "-cpu", model]


def portable_figures(module: str, function: str) -> object:
    """``module.function()`` run in a child Python under :data:`PORTABLE_NUMERICS`; its JSON
    result. The child imports torch fresh, so the settings take effect before any kernel runs.
    With :data:`PORTABLE_CPU_VARIABLE` set the child runs emulated as on that CPU model (about 8
    times slower: no time limit on it then)."""
    import json
    import subprocess

    code = ("import json, importlib, torch; torch.backends.mkldnn.enabled = False; "
            "torch.set_num_threads(1); "
            f"print(json.dumps(getattr(importlib.import_module({module!r}), {function!r})()))")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, **PORTABLE_NUMERICS,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    prefix = emulator(os.environ.get(PORTABLE_CPU_VARIABLE))
    done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=root, timeout=None if prefix else 600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{module}.{function} failed in the portable child:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads, then give the caller's count back."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
