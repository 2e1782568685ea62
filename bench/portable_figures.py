"""How far the pinned attack figures of the tests move across CPU kernels, and how far a real
change of behaviour moves them: the evidence behind the tolerances of
``tests/test_presets.py`` and ``tests/test_attack_parts.py``.

Each configuration runs the pinned cases (``tests.test_presets.measure_pinned`` and
``tests.test_attack_parts.measure_undefended``) in a fresh child process under one numeric
setting — ATen's CPU kernels (``ATEN_CPU_CAPABILITY`` default / avx2 / avx512, those this CPU
has), MKL's reproducibility mode (``MKL_CBWR`` COMPATIBLE / AVX2 / AVX512 / unset), oneDNN on
or off, one thread — as a proxy for other CPUs (the tests run on Intel and AMD machines). The
reference is the portable setting the tests use (:data:`tests.helpers.PORTABLE_NUMERICS`). Then
every attack's learning rate is raised by 1 % (a real change of behaviour the tests must catch)
and the same figures are compared. Printed per case: the largest relative move across the
kernels, and the smallest figure move a 1 % learning-rate change makes (the largest over the
case's figures: the test fails when any figure leaves its tolerance).

    OMP_NUM_THREADS=1 python bench/portable_figures.py            # every configuration
    OMP_NUM_THREADS=1 python bench/portable_figures.py --quick    # default and the CPU's best
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import PORTABLE_NUMERICS  # noqa: E402

#: The child: the figures under the environment it was started with, as JSON.
_CHILD = """
import json, os, importlib, torch
if os.environ.get("NO_MKLDNN"):
    torch.backends.mkldnn.enabled = False
torch.set_num_threads(1)
scale = float(os.environ.get("LR_SCALE", "1"))
presets = importlib.import_module("tests.test_presets")
parts = importlib.import_module("tests.test_attack_parts")
if scale != 1:
    from fedleak.attacks import create_attack as original

    def perturbed(name, options=None):
        options = dict(options or {})
        options["lr"] = original(name, options).optimiser_part().config.lr * scale
        return original(name, options)

    presets.create_attack = parts.create_attack = perturbed
print(json.dumps({"pinned": presets.measure_pinned(), "undefended": parts.measure_undefended(),
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""


def figures(env: dict[str, str]) -> dict:
    """The pinned figures in a child process under ``env`` (added to this one's)."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))}
    for key in ("MKL_CBWR", "ATEN_CPU_CAPABILITY"):
        if env.get(key) == "unset":
            full.pop(key, None)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=1800, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cases(result: dict) -> dict[str, list[float]]:
    """Case → its figures, flattened (restart objectives, image sum, |sum|)."""
    out: dict[str, list[float]] = {}
    for name, value in result["pinned"].items():
        out[name] = [float(x) for x in _flat(value)]
    for i, value in enumerate(result["undefended"]):
        out[f"undefended-{i}"] = [float(x) for x in _flat(value)]
    return out


def _flat(value: object) -> list[object]:
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [value]


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def capabilities() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    have = ["default"]
    if " avx2" in flags:
        have.append("avx2")
    if " avx512f" in flags:
        have.append("avx512")
    return have


@click.command()
@click.option("--quick", is_flag=True, help="only the default kernels and the CPU's best")
def main(quick: bool) -> None:
    portable = {**PORTABLE_NUMERICS, "NO_MKLDNN": "1"}  # as tests.helpers.portable_figures
    reference = cases(figures(portable))
    kernels = capabilities()
    settings = [(cap, cbwr, dnn) for cap in kernels
                for cbwr in ("COMPATIBLE", "AVX2", "AVX512", "unset") for dnn in ("off", "on")]
    if quick:
        settings = [("default", "COMPATIBLE", "on"), (kernels[-1], "unset", "on")]
    moved = {case: 0.0 for case in reference}
    for cap, cbwr, dnn in settings:
        env = {"ATEN_CPU_CAPABILITY": cap, "MKL_CBWR": cbwr}
        if dnn == "off":
            env["NO_MKLDNN"] = "1"
        got = cases(figures(env))
        worst = 0.0
        for case, values in reference.items():
            change = max(relative(g, r) for g, r in zip(got[case], values, strict=True)
                         if abs(r) > 1e-6)
            moved[case] = max(moved[case], change)
            worst = max(worst, change)
        print(f"kernels {cap}, MKL_CBWR {cbwr}, oneDNN {dnn}: largest relative move "
              f"{worst:.2e}", flush=True)
    perturbed = cases(figures({**portable, "LR_SCALE": "1.01"}))
    print(f"\n{'case':<18} {'across kernels':>15} {'lr +1 %':>10}")
    for case, values in reference.items():
        change = max(relative(g, r) for g, r in zip(perturbed[case], values, strict=True)
                     if abs(r) > 1e-6)
        print(f"{case:<18} {moved[case]:>15.2e} {change:>10.2e}")
    print("\n(figures below 1e-6 in magnitude — converged objectives — are left out of the "
          "relative moves; the tests compare them with an absolute tolerance)")


if __name__ == "__main__":
    main()
