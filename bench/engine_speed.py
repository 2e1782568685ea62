"""CPU time per iteration of the attack engine, beside a textbook loop and the FLOP floor.

For each case (model, images n, restarts R) an observation is built as the harness builds it
(model zoo, the victim's ``local_update``, the attacker's ``UpdateSimulator``) for random
3×H×W images, and three things are timed in the same process, one after the other, as **CPU
time of the process** (``time.process_time``: other processes on a loaded machine do not count,
unlike wall time):

- ``engine``: ``create_attack("inverting-gradients", ...).reconstruct`` — the real code path
  (eager by default; ``--engine-options compile=on`` etc. pass options);
- ``textbook``: the plain loop a user would write, over the *same* objective (eq. (4) of
  Geiping et al. 2020: 1 − cos(u(x), u*) + α TV(x), signed Adam with ``torch.optim.Adam`` and
  ``MultiStepLR``, the box projection): ``torch.autograd.grad(CE, θ, create_graph=True)`` on
  the model, the cosine through ``torch.nn.functional.cosine_similarity`` of the concatenated
  update, ``.backward()`` to the images. R restarts run one after the other (R× the time);
- ``floor``: the FLOPs of one textbook iteration counted by ``torch.utils.flop_counter``
  (forward, first backward, second backward), divided by one core's measured throughput on a
  square float32 GEMM (``--gemm``): the time the arithmetic would take at full speed. It is a
  floor for a compute-bound loop, not a promise: tiny convolutions never reach GEMM speed.

Each timing is the median over windows of ``--window`` iterations (stamped at the progress
reports; the first window, warm-up and setup, excluded) of ``--iterations``, per iteration of
all R restarts together. ``--threads`` sets torch's intra-op threads
(1 by default: the figure of the issue; 0 leaves torch's default and adds wall time).

    .venv/bin/python bench/engine_speed.py                        # every case, one thread
    .venv/bin/python bench/engine_speed.py --cases lenet-zhu:1:1 --iterations 200
    .venv/bin/python bench/engine_speed.py --engine-options compile=on

Cases are ``MODEL:n:R[:SIDE]`` (SIDE the image side, 32 by default).

Beside the table (``--beside``, both by default) two other workloads of the engine, timed the
same way: DAGER on the text decoder at 8 × 32 (``bench/dager.py``'s first batch: a random-init
``gpt2:hidden=768,heads=12,layers=2``, the bundled Shakespeare's held-out rows, seed 0; CPU and
wall seconds of ``reconstruct``, its ROUGE), and a default audit's trials per second
(``bench/audit.py``'s Gaussian σ = 1 victim process, the trials the victim chooses unless
``--audit-trials``; trials over the trials' own wall time, and the whole audit with the victim's
start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from fedleak.attacks import Observation, create_attack
from fedleak.attacks.optimisation.optimisers import decay_milestones
from fedleak.attacks.optimisation.priors import total_variation
from fedleak.harness.federated.local_update import UpdateSimulator, set_training_mode
from fedleak.harness.federated.observe import observe
from fedleak.harness.zoo.datasets import DatasetInfo
from fedleak.harness.zoo.models import build_model

DEFAULT_CASES = ("lenet-zhu:1:1", "lenet-zhu:8:1", "lenet-zhu:1:8", "resnet20-4:1:1",
                 "resnet18:1:1:224")
#: iterations timed per case (after warm-up), by model
ITERATIONS = {"lenet-zhu": 200, "resnet20-4": 12, "resnet18": 4}
#: iterations per timed window, by model (the first window is warm-up)
WINDOWS = {"lenet-zhu": 20, "resnet20-4": 2, "resnet18": 1}
TV_WEIGHT = 1e-2


@dataclass(frozen=True)
class Case:
    """One timed configuration: model, images n, restarts R, image side."""

    model: str
    images: int
    restarts: int
    side: int

    @classmethod
    def parse(cls, text: str) -> Case:
        fields = text.split(":")
        if len(fields) not in (3, 4):
            raise SystemExit(f"a case is MODEL:n:R[:SIDE], got {text!r}")
        side = int(fields[3]) if len(fields) == 4 else 32
        return cls(fields[0], int(fields[1]), int(fields[2]), side)

    def __str__(self) -> str:
        return f"{self.model} n={self.images} R={self.restarts} {self.side}px"


def observation_for(case: Case, seed: int = 0) -> Observation:
    """One FedSGD round of ``case.model`` on ``case.images`` random images (labels 3, 4, …)."""
    torch.manual_seed(seed)
    shape = (3, case.side, case.side)
    classes = 1000 if case.side >= 128 else 10
    model = build_model(case.model, shape, classes)
    images = torch.rand(case.images, *shape)
    labels = (torch.arange(case.images) + 3) % classes
    info = DatasetInfo("random", shape, classes, (0.5,) * 3, (0.5,) * 3, ())
    return observe(model, images, labels, info)


def window_median(stamps: list[float], window: int) -> float:
    """Median seconds per iteration over the windows after the first (warm-up) one."""
    rates = [(b - a) / window for a, b in zip(stamps[1:-1], stamps[2:], strict=True)]
    if not rates:
        raise SystemExit("too few iterations: give at least 3 windows (--iterations, --window)")
    return statistics.median(rates)


def engine_seconds(observation: Observation, restarts: int, options: dict[str, Any],
                   iterations: int, window: int, clock: Callable[[], float]) -> float:
    """Seconds per iteration (all R restarts) of the registered attack's ``reconstruct``,
    timed by ``clock`` at its progress reports every ``window`` iterations."""
    stamps: list[float] = []

    def progress(done: int, total: int, value: float) -> None:
        if done % (window * restarts) == 0:
            stamps.append(clock())

    attack = create_attack("inverting-gradients", {
        **options, "iterations": iterations, "restarts": restarts, "log_every": window})
    stamps.append(clock())
    attack.reconstruct(observation, device="cpu", seed=0, progress=progress)
    return window_median(stamps, window)


def textbook_step(observation: Observation) -> tuple[torch.Tensor, Callable[[int, int], None]]:
    """The textbook iteration on one candidate batch: returns x and ``step(i, T)``."""
    simulator = observation.simulate
    assert isinstance(simulator, UpdateSimulator)
    model = simulator.model
    with torch.no_grad():  # the global parameters θ the server sent
        for name, p in model.named_parameters():
            p.copy_(simulator.parameters[name])
    params = list(model.parameters())
    labels = observation.labels if observation.labels is not None else \
        (torch.arange(observation.num_images) + 3) % 10
    lower, upper = observation.image_bounds("cpu")
    observed = torch.cat([u.flatten() for u in observation.update])
    x = torch.randn(observation.num_images, *observation.image_shape).requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=0.1)
    state: dict[str, Any] = {}

    def step(i: int, iterations: int) -> None:
        if i == 0:
            state["scheduler"] = torch.optim.lr_scheduler.MultiStepLR(
                optimiser, list(decay_milestones(iterations)), gamma=0.1)
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        candidate = torch.cat([g.flatten() for g in grads])
        objective = 1 - torch.nn.functional.cosine_similarity(candidate, observed, dim=0)
        objective = objective + TV_WEIGHT * total_variation(x)
        objective.backward()
        assert x.grad is not None
        x.grad.sign_()
        optimiser.step()
        state["scheduler"].step()
        with torch.no_grad():
            x.copy_(torch.max(torch.min(x, upper), lower))

    set_training_mode(model, simulator.protocol)
    return x, step


def textbook_seconds(observation: Observation, restarts: int, iterations: int, window: int,
                     clock: Callable[[], float]) -> float:
    """Seconds per iteration of R textbook loops one after the other (R × one loop's)."""
    _, step = textbook_step(observation)
    stamps = [clock()]
    for i in range(iterations):
        step(i, iterations)
        if (i + 1) % window == 0:
            stamps.append(clock())
    return window_median(stamps, window) * restarts


def iteration_flops(observation: Observation) -> int:
    """FLOPs of one textbook iteration (one restart), by ``torch.utils.flop_counter``."""
    _, step = textbook_step(observation)
    step(0, 10)
    with FlopCounterMode(display=False) as counter:
        step(1, 10)
    return int(counter.get_total_flops())


def gemm_flops_per_second(size: int, repeats: int = 20) -> float:
    """One process's float32 GEMM throughput at ``size``×``size`` (FLOP per CPU second)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.process_time()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / max(time.process_time() - start, 1e-9)


def parse_options(items: list[str]) -> dict[str, Any]:
    """``k=v`` engine options (``on``/``off`` become booleans)."""
    options: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        options[key] = {"on": True, "off": False}.get(value, value)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument("--iterations", type=int, default=0, help="0: per-model default")
    parser.add_argument("--window", type=int, default=0,
                        help="iterations per timed window (0: per-model default)")
    parser.add_argument("--threads", type=int, default=1, help="0: torch's default")
    parser.add_argument("--gemm", type=int, default=512, help="GEMM side for the throughput")
    parser.add_argument("--skip", nargs="*", default=[], choices=("engine", "textbook"))
    parser.add_argument("--engine-options", nargs="*", default=[],
                        help="k=v options of the attack (compile=on, …)")
    parser.add_argument("--beside", nargs="*", default=["dager", "audit"],
                        choices=("dager", "audit"),
                        help="other workloads timed after the table (none: --beside)")
    parser.add_argument("--audit-trials", type=int, default=0,
                        help="trials of the audit (0: the victim's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    options = parse_options(args.engine_options)
    peak = gemm_flops_per_second(args.gemm)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load average {load}, "
          f"GEMM {args.gemm}² {peak / 1e9:.1f} GFLOP/s per CPU second, engine options "
          f"{options or 'default'}")
    print(f"{'case':<30} {'MFLOP/it':>9} {'floor ms':>9} {'textbook ms':>12} "
          f"{'engine ms':>10} {'vs textbook':>12} {'vs floor':>9}")
    for text in args.cases:
        case = Case.parse(text)
        observation = observation_for(case)
        iterations = args.iterations or ITERATIONS.get(case.model, 20)
        window = args.window or WINDOWS.get(case.model, 2)
        flops = iteration_flops(observation) * case.restarts
        floor = flops / peak * 1e3
        timed: dict[str, float] = {}
        if "textbook" not in args.skip:
            timed["textbook"] = textbook_seconds(observation, case.restarts, iterations,
                                                 window, time.process_time) * 1e3
        if "engine" not in args.skip:
            timed["engine"] = engine_seconds(observation, case.restarts, options, iterations,
                                             window, time.process_time) * 1e3
        textbook, engine = timed.get("textbook", float("nan")), timed.get("engine", float("nan"))
        print(f"{str(case):<30} {flops / 1e6:>9.1f} {floor:>9.2f} {textbook:>12.2f} "
              f"{engine:>10.2f} {textbook / engine:>11.2f}x {engine / floor:>8.1f}x", flush=True)
        if args.threads == 0 and "engine" not in args.skip:
            wall = engine_seconds(observation, case.restarts, options, iterations, window,
                                  time.perf_counter) * 1e3
            print(f"{'':<30} engine wall {wall:.2f} ms/it at {torch.get_num_threads()} threads")
    if "dager" in args.beside:
        print(dager_line(), flush=True)
    if "audit" in args.beside:
        print(audit_line(args.audit_trials), flush=True)


def dager_line(batch_size: int = 8, seq_len: int = 32) -> str:
    """DAGER on the decoder at ``batch_size`` × ``seq_len``: CPU and wall s, ROUGE (docstring)."""
    from dager import batch_round, scored, spec

    from fedleak.attacks.text_observation import TextReconstruction
    from fedleak.harness.zoo.text.text_datasets import load_text_dataset
    from fedleak.harness.zoo.text.text_models import build_text_model

    data = load_text_dataset("shakespeare", "test", task="lm", seq_len=seq_len)
    public = [[t for t in row if t] for row in
              load_text_dataset("shakespeare", "train", task="lm", seq_len=seq_len)
              .tokens[:2000].tolist()]
    torch.manual_seed(0)
    model = build_text_model(spec("decoder", 768, 12, 2), data.info)
    observation, truth = batch_round(data, model, 0, batch_size, public)
    cpu, wall = time.process_time(), time.perf_counter()
    found = create_attack("dager", {}).reconstruct(observation)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert isinstance(found, TextReconstruction)
    score = scored(data, truth, found)
    return (f"DAGER decoder {batch_size}x{seq_len} (gpt2 768x2, random init, Shakespeare test "
            f"rows 0-{batch_size - 1}): {cpu:.2f} CPU s, {wall:.2f} s wall, ROUGE-1 "
            f"{score['rouge1']:.3f} / ROUGE-2 {score['rouge2']:.3f}, {score['exact']} of "
            f"{score['sentences']} exact")


def audit_line(trials: int) -> str:
    """A default audit of the Gaussian mechanism σ = 1 through a victim process (docstring)."""
    from audit import MECHANISMS, audit_one

    from fedleak.harness.attacker.games.audit_trials import AuditSettings

    (gaussian,) = [m for m in MECHANISMS if m.key == "gaussian-1"]
    record, wall = audit_one(gaussian, AuditSettings(trials=trials, show_progress=False), 1)
    return (f"audit, Gaussian sigma = 1 (digits MLP victim process, {record.trials} trials): "
            f"{record.trials / record.trial_seconds:.1f} trials/s over the trials' "
            f"{record.trial_seconds:.2f} s; {wall:.2f} s with the victim's start")


if __name__ == "__main__":
    main()
