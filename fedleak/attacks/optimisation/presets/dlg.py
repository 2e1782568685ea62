"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019), the baseline of Inverting Gradients.

DLG matches the observed update ``u*`` with the replayed update ``u(x, ŷ)`` in the squared
euclidean distance (eq. (3) of Geiping et al.),

    x̂ = argmin_x  Σ_l ‖u_l(x, ŷ) − u*_l‖²     (sum over every parameter tensor l),

with L-BFGS from a Gaussian N(0, 1) init in normalised space and no box constraint. Labels are
recovered analytically (iDLG, :func:`fedleak.attacks.labels.recover_labels`) rather than
optimised jointly. Geiping et al.'s supplement (Sec. C.1) runs 300 L-BFGS steps with 16 (LeNet)
or 8 (ResNet) restarts; each L-BFGS step evaluates the objective up to ``inner_iterations``
times (PyTorch's ``max_iter``, 20 as in Zhu's code). The supplement quotes a step size of 1e-4;
with PyTorch's L-BFGS (no line search, as in Zhu's code) it barely moves the images (measured
on an untrained 32×32 LeNet: after 50 steps the distance is still 160 and the PSNR 7.9 dB,
against 3e-4 and 32 dB with lr = 1), so the default is Zhu's lr = 1; pass ``lr=1e-4`` to
reproduce the quote.

On CUDA (``capture``, the default) the objective and its gradient — the replay's forward and
double backward, the distance, the vector–Jacobian product back to the images — are recorded
once as a CUDA graph and replayed at every evaluation L-BFGS asks for. L-BFGS itself cannot be
captured: its two-loop recursion is cheap, but its stopping tests and line search branch on
the objective in Python (``torch.optim.LBFGS`` reads it to the host at every evaluation), so it
stays eager around the captured evaluation.

A preset of the composed optimisation attack (:mod:`fedleak.attacks.optimisation.composed`):
objective ``euclidean``, no priors, optimiser ``lbfgs``, Gaussian init; the shorthand options
``lr``, ``inner_iterations``, ``history_size`` and ``line_search`` set the optimiser.

L-BFGS on a third-order problem diverges now and then: every evaluated iterate with a finite
objective lower than any before is kept, and a restart stops as soon as the objective or the
images stop being finite; the best finite iterate is its result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.optimisation.composed import ComposedInversion
from fedleak.attacks.optimisation.engine.composed_config import ComposedConfig, check_numbers
from fedleak.attacks.optimisation.optimisers import LINE_SEARCHES


@dataclass
class DLGConfig(ComposedConfig):
    """Hyperparameters of DLG with L-BFGS."""

    iterations: int = field(default=300, metadata={"help": "L-BFGS steps per restart"})
    restarts: int = field(
        default=1, metadata={"help": "random inits (paper: 16 LeNet, 8 ResNet); best kept"}
    )
    objective: str = field(default="euclidean", metadata={
        "help": "objective part (euclidean: DLG's distance; cosine, masked-cosine, gaussian, "
                "or auto: the one modelling the published defenses)"})
    log_every: int = field(default=10, metadata={"help": "report progress every k steps"})
    lr: float = field(default=1.0, metadata={"help": "L-BFGS step size (Zhu's code: 1)"})
    inner_iterations: int = field(
        default=20, metadata={"help": "objective evaluations per L-BFGS step (max_iter)"}
    )
    history_size: int = field(default=100, metadata={"help": "L-BFGS memory"})
    line_search: str = field(
        default="none", metadata={"help": "'none' (Zhu's code) or 'strong_wolfe'"}
    )

    def __post_init__(self) -> None:
        """Refuse a non-positive step size, counts below 1 and an unknown line search."""
        super().__post_init__()
        check_numbers(self, positive=("lr",), at_least_one=("inner_iterations", "history_size"))
        if self.line_search not in LINE_SEARCHES:
            raise ValueError(
                f"line_search must be 'none' or 'strong_wolfe', got {self.line_search!r}"
            )


def gradient_distance(candidate: Sequence[torch.Tensor],
                      observed: Sequence[torch.Tensor]) -> torch.Tensor:
    """``Σ_l ‖u_l − u*_l‖²`` over all parameter tensors (DLG's objective)."""
    return torch.stack(
        [(u - o).square().sum() for u, o in zip(candidate, observed, strict=True)]
    ).sum()


@register_attack("dlg")
class DLG(ComposedInversion):
    """Zhu et al.'s DLG: euclidean gradient matching optimised with L-BFGS (iDLG labels)."""

    Config = DLGConfig
    config: DLGConfig

    def shorthand_optimiser(self) -> tuple[str, dict[str, Any]]:
        """Return L-BFGS with DLG's step size, inner iterations, history and line search."""
        cfg = self.config
        return "lbfgs", {"lr": cfg.lr, "inner": cfg.inner_iterations,
                         "history": cfg.history_size, "line_search": cfg.line_search}
