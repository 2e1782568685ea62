"""How far the pinned attack figures of the tests move across CPU kernels, and how far a real
change of behaviour moves them: the evidence behind the tolerances of
``tests/attacks/optimisation/test_presets.py`` and ``tests/attacks/optimisation/test_parts.py``.

Each configuration runs the pinned cases (``tests.attacks.optimisation.test_presets.measure_pinned``
and ``tests.attacks.optimisation.test_parts.measure_undefended``) in a fresh child process under one
numeric setting — ATen's CPU kernels (``ATEN_CPU_CAPABILITY`` default / avx2 / avx512, those this
CPU has), MKL's reproducibility mode (``MKL_CBWR`` COMPATIBLE / AVX2 / AVX512 / unset), oneDNN on
or off, one thread — as a proxy for other CPUs (the tests run on Intel and AMD machines). The
reference is the portable setting the tests use (:data:`tests.helpers.PORTABLE_NUMERICS`). Then
every attack's learning rate is raised by 1 % (a real change of behaviour the tests must catch)
and the same figures are compared. Printed per case: the largest relative move across the
kernels, and the smallest figure move a 1 % learning-rate change makes (the largest over the
case's figures: the test fails when any figure leaves its tolerance).

    OMP_NUM_THREADS=1 python bench/portable_figures.py            # every configuration
    OMP_NUM_THREADS=1 python bench/portable_figures.py --quick    # default and the CPU's best
    OMP_NUM_THREADS=1 python bench/portable_figures.py --cpu EPYC-Rome-v2 --cpu EPYC-Milan

``--cpu MODEL`` runs the tests' own portable child (:data:`tests.helpers.PORTABLE_NUMERICS`)
under ``qemu-x86_64 -cpu MODEL`` (Debian's ``qemu-user``) instead: the child's CPUID is that
model's — an AMD EPYC says ``AuthenticAMD`` and has no AVX-512 (Rome) — so MKL, oneDNN and ATen
pick their kernels as they would on that CPU, while the arithmetic stays IEEE (QEMU's soft
float, fused multiply-add included). It is the pinned tests run as on another CPU without one;
it is slow (about 8 times the native run), and it is not a run on the silicon: it covers the
kernel choice a CPU's identity makes, not instructions whose results differ by vendor (the
approximate reciprocals ``rcpps`` / ``rsqrtps``, which QEMU computes its own way).
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

from tests.attacks.optimisation.test_presets import CONVERGED_RTOL, PINNED  # noqa: E402
from tests.helpers import FIGURE_RTOL, PORTABLE_NUMERICS, emulator  # noqa: E402

#: The child: the figures under the environment it was started with, as JSON.
_CHILD = """
import json, os, importlib, torch
if os.environ.get("NO_MKLDNN"):
    torch.backends.mkldnn.enabled = False
torch.set_num_threads(1)
scale = float(os.environ.get("LR_SCALE", "1"))
presets = importlib.import_module("tests.attacks.optimisation.test_presets")
parts = importlib.import_module("tests.attacks.optimisation.test_parts")
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


def figures(env: dict[str, str], cpu: str | None = None) -> dict:
    """The pinned figures in a child process under ``env`` (added to this one's); with ``cpu``,
    the child runs under ``qemu-x86_64 -cpu cpu``."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))}
    for key in ("MKL_CBWR", "ATEN_CPU_CAPABILITY"):
        if env.get(key) == "unset":
            full.pop(key, None)
    done = subprocess.run([*emulator(cpu), sys.executable, "-c", _CHILD], capture_output=True,
                          text=True, env=full, cwd=ROOT, timeout=None if cpu else 1800, check=False)
    if done.returncode != 0:
        raise click.ClickException(f"the child failed{' under ' + cpu if cpu else ''}:\n"
                                   f"{done.stderr[-2000:]}")
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


def largest_move(got: dict[str, list[float]], reference: dict[str, list[float]]
                 ) -> dict[str, float]:
    """Case → the largest relative move of its figures (figures below 1e-6 left out)."""
    return {case: max((relative(g, r) for g, r in zip(got[case], values, strict=True)
                       if abs(r) > 1e-6), default=0.0)
            for case, values in reference.items()}


def emulated(models: tuple[str, ...], portable: dict[str, str],
             reference: dict[str, list[float]]) -> None:
    """The portable child under each emulated CPU model, against the native reference, each
    case beside the tolerance its test allows (dlg-2, a converged run, :data:`CONVERGED_RTOL`).
    The tests themselves run emulated with ``FEDLEAK_PORTABLE_CPU=MODEL``."""
    for model in models:
        result = figures(portable, cpu=model)
        moves = largest_move(cases(result), reference)
        outside = 0
        print(f"\n{model}: relative move from this machine's figures, and the tests' tolerance",
              flush=True)
        for case, move in moves.items():
            allowed = CONVERGED_RTOL if case in PINNED and PINNED[case][-1] else FIGURE_RTOL
            outside += move > allowed
            print(f"  {case:<18} {move:.2e}  ({allowed:g}){'  OUTSIDE' if move > allowed else ''}")
        print(f"{model}: {len(moves) - outside} of {len(moves)} cases within their tolerance",
              flush=True)


@click.command()
@click.option("--quick", is_flag=True, help="only the default kernels and the CPU's best")
@click.option("--cpu", "models", multiple=True, metavar="MODEL",
              help="run the portable child under qemu-x86_64 -cpu MODEL (e.g. EPYC-Rome-v2, "
                   "EPYC-Milan, Haswell): the pinned figures as on that CPU; repeatable")
def main(quick: bool, models: tuple[str, ...]) -> None:
    portable = {**PORTABLE_NUMERICS, "NO_MKLDNN": "1"}  # as tests.helpers.portable_figures
    try:
        emulator(models[0] if models else None)  # no QEMU: said before the native run
    except RuntimeError as error:
        raise click.ClickException(str(error)) from None
    reference = cases(figures(portable))
    if models:
        emulated(models, portable, reference)
        return
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
        changes = largest_move(cases(figures(env)), reference)
        moved = {case: max(moved[case], change) for case, change in changes.items()}
        worst = max(changes.values())
        print(f"kernels {cap}, MKL_CBWR {cbwr}, oneDNN {dnn}: largest relative move "
              f"{worst:.2e}", flush=True)
    perturbed = largest_move(cases(figures({**portable, "LR_SCALE": "1.01"})), reference)
    print(f"\n{'case':<18} {'across kernels':>15} {'lr +1 %':>10}")
    for case, change in perturbed.items():
        print(f"{case:<18} {moved[case]:>15.2e} {change:>10.2e}")
    print("\n(figures below 1e-6 in magnitude — converged objectives — are left out of the "
          "relative moves; the tests compare them with an absolute tolerance)")


if __name__ == "__main__":
    main()
