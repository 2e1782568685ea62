"""Inductor's vector-ISA probe, run once per machine and remembered in fedleak's cache.

Before Inductor writes C++ for a CPU it asks which vector instruction sets the CPU lists
(AVX-512 VNNI, AVX-512, AVX2, …: ``cpu_vec_isa.x86_isa_checker``) the compiler
also builds and the process loads: for each it builds a test library (cached on disk) and
starts a Python process that loads it (``dlopen``). That is about 1 s of wall time in *every*
process that compiles or loads a compiled step (two such starts on this project's AMD EPYC),
to learn an answer that only changes with the CPU, the compiler or torch.

:func:`trust_probed_isa` runs that probe the first time, as Inductor would, and writes its
answer to ``vector-isa.json`` in fedleak's compile cache under a key of the torch version,
the ISAs the CPU lists and the compilers Inductor looks for (path, size and modification
time). When every ISA the CPU lists passed, it sets Inductor's ``cpp.vec_isa_ok`` (take the
CPU's list without probing) in this process and every later one with the same key: the same
ISAs the probe returns, so the same code. When some ISA failed, nothing is trusted and every
process probes as before. A ``cpp.vec_isa_ok`` the user set (``TORCHINDUCTOR_VEC_ISA_OK``) is
left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import torch

#: the file in the compile cache: {key: whether every listed ISA passed the probe}
RECORD = "vector-isa.json"


def listed_isas() -> list[str]:
    """Return the vector ISAs Inductor knows that the CPU lists, best first (no probe)."""
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
            if str(isa) and all(flag in flags for flag in str(isa).split())]


def compiler_identity() -> str:
    """Describe the C++ compilers Inductor looks for (``cpp.cxx``): path, size, time.

    Read from the file system, without starting the compiler (Inductor's own search runs it).
    """
    import torch._inductor.config as inductor_config

    names = inductor_config.cpp.cxx
    found = []
    for name in names if isinstance(names, (list, tuple)) else (names,):
        if not name:
            continue
        path = shutil.which(name) or name
        try:
            stat = os.stat(os.path.realpath(path))
            found.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
        except OSError:
            found.append(f"{path}:missing")
    return ";".join(found)


def probe_key(listed: list[str]) -> str:
    """SHA-256 of what the probe's answer depends on (module docstring)."""
    parts = (torch.__version__, platform.machine(), listed, compiler_identity())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def probed_isas() -> list[str]:
    """Inductor's own probe: the listed ISAs that build and load."""
    from torch._inductor import cpu_vec_isa

    return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]


def trust_probed_isa(cache_dir: Path) -> bool:
    """Set ``cpp.vec_isa_ok`` where this machine's probe passed every listed ISA (module docs).

    Returns whether it did. Only on x86-64 (where Inductor probes by starting processes).
    """
    import torch._inductor.config as inductor_config

    if platform.machine() not in ("x86_64", "AMD64") or inductor_config.cpp.vec_isa_ok \
            is not None:
        return False
    listed = listed_isas()
    if not listed:
        return False
    key = probe_key(listed)
    path = cache_dir / RECORD
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            record = {}
    except (OSError, ValueError):
        record = {}
    passed = record.get(key)
    if not isinstance(passed, bool):
        passed = probed_isas() == listed
        record[key] = passed
        _write(path, record)
    if passed:
        inductor_config.cpp.vec_isa_ok = True
    return passed


def _write(path: Path, record: dict[str, bool]) -> None:
    """Write ``record`` to ``path`` whole (a temporary file renamed); a failure is no error."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            json.dump(record, file)
        os.replace(temporary, path)
