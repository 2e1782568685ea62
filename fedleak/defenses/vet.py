"""Vetting what the server sends before training on it: refuse parameters built to leak.

The malicious-server attacks leave structure in θ that honest models do not have. ``vet``
runs before local training, on the parameters the server sent and on the user's own private
batch, and refuses the round (the victim answers ``FAILED_PRECONDITION`` with the reason) when
any enabled test fires:

- ``rows``: in some linear layer, two rows (or two columns) of at least 32 values each point
  the same way, ``max |cos(W_i, W_j)|`` ≥ ``max_cosine`` (default 0.99). Random
  initialisations and trained layers give cosines far below that (about √(4 ln m / d) for m
  random rows of dimension d); the imprint attack sets every row of its first layer to the
  same measurement and every column of the second to the same vector (cosine 1).
- ``activation``: on the user's own batch, the mean fraction of inputs that switch on a unit
  of a linear layer followed by ReLU is below ``min_activation`` (default 0.25). About half
  the units fire for an input under an honest initialisation; trap weights make each fire for
  about 1/N of the inputs.
- ``classifier``: one row of the last linear layer is ``max_row_ratio`` (default 8) times
  longer than the median row. Fishing magnifies the target class's row to gate the gradient.
- ``architecture``: the model carries fedleak's imprint block (recognised by type), an
  architecture a server designed to read inputs.

The attacks each test answers: imprint (Fowl et al. 2022), trap weights (Boenisch et al.
2023) and fishing (Wen et al. 2022).

Kerckhoffs: these tests are public, and an adaptive server can sidestep each one — rows made
to differ by small random perturbations pass ``rows`` while still binning approximately;
traps calibrated to fire for 5 % of inputs pass ``activation`` with fewer exact recoveries; a
gate with a smaller magnification passes ``classifier`` with a softer gate. ``vet`` therefore
measures what the attacks *as implemented here* need, and docs/malicious.md says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import ParameterCheck

#: vectors (rows or columns) shorter than this are not compared: among many short random
#: vectors some pair is nearly parallel by chance (resnet152's classifier has 2,048 columns of
#: 10 values, and two of them reach ``|cos|`` 0.99 at one seed)
MIN_DIMENSION = 32
MAX_ROWS_COMPARED = 4096


@dataclass
class VetConfig:
    """Which of vet's tests run, and the threshold of each."""

    rows: bool = field(default=True, metadata={"help": "refuse near-parallel rows/columns"})
    activation: bool = field(default=True, metadata={
        "help": "refuse ReLU layers whose units fire for few of the user's inputs"})
    classifier: bool = field(default=True, metadata={
        "help": "refuse a classifier row much longer than the others"})
    architecture: bool = field(default=True, metadata={
        "help": "refuse a model with an imprint block"})
    max_cosine: float = field(default=0.99, metadata={
        "help": "largest |cosine| allowed between two rows (or columns) of a linear layer"})
    min_activation: float = field(default=0.25, metadata={
        "help": "smallest mean fraction of inputs a ReLU unit may fire for"})
    max_row_ratio: float = field(default=8.0, metadata={
        "help": "largest ratio of a classifier row's norm to the median row norm"})

    def __post_init__(self) -> None:
        """Refuse thresholds outside the range where a test means anything."""
        if not 0 < self.max_cosine <= 1:
            raise ValueError(f"max-cosine must lie in (0, 1], got {self.max_cosine}")
        if not 0 <= self.min_activation < 1:
            raise ValueError(f"min-activation must lie in [0, 1), got {self.min_activation}")
        if not (math.isfinite(self.max_row_ratio) and self.max_row_ratio > 1):
            raise ValueError(f"max-row-ratio must be a number > 1, got {self.max_row_ratio}")


def max_abs_cosine(matrix: torch.Tensor) -> float:
    """Return ``max |cos|`` between two distinct non-zero rows (0 with fewer than two).

    ``max_{i≠j} |⟨w_i, w_j⟩| / (‖w_i‖ ‖w_j‖)`` over the first :data:`MAX_ROWS_COMPARED` non-zero
    rows of ``matrix``, in float64.
    """
    rows = matrix.detach().double()
    norms = rows.norm(dim=1)
    rows = rows[norms > 0][:MAX_ROWS_COMPARED]
    if rows.shape[0] < 2:
        return 0.0
    unit = rows / rows.norm(dim=1, keepdim=True)
    cosines = (unit @ unit.T).abs()
    cosines.fill_diagonal_(0)
    return float(cosines.max())


def linear_weights(model: nn.Module, parameters: dict[str, torch.Tensor]
                   ) -> list[tuple[str, nn.Linear, torch.Tensor]]:
    """Return (module name, module, sent weight) of every linear layer, in module order."""
    found = []
    for name, module in model.named_modules():
        key = f"{name}.weight" if name else "weight"
        if isinstance(module, nn.Linear) and key in parameters:
            found.append((name, module, parameters[key]))
    return found


def unit_activation_rate(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    images: torch.Tensor,
) -> dict[str, float]:
    """Return, per linear layer followed by ReLU, how often its units are on.

    The mean over units j and inputs x of ``images`` of 1[w_j·x + b_j > 0], at
    ``parameters`` (the model in eval mode, without gradients).
    """
    from torch.func import functional_call

    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    gated = {name for (name, module), (_, after) in zip(leaves, leaves[1:], strict=False)
             if isinstance(module, nn.Linear) and isinstance(after, nn.ReLU)}
    gated |= {name for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and name.endswith("imprint.linear0")}
    rates: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if name in gated:
            def keep(_: nn.Module, __: object, output: torch.Tensor, name: str = name) -> None:
                rates[name] = float((output.detach() > 0).double().mean())
            hooks.append(module.register_forward_hook(keep))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            functional_call(model, {**parameters, **buffers}, (images,))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return rates


@register_defense("vet")
class Vet(ParameterCheck):
    """Refuse a round whose θ has the structure of a malicious-server attack (module doc)."""

    Config = VetConfig
    config: VetConfig

    def refuses_model(self, model: nn.Module) -> str | None:
        """Return why every round will be refused: the model carries an imprint block.

        The ``architecture`` test judges the model, not θ: a model with an imprint block is
        refused in every round, so say so once, up front.
        """
        if not self.config.architecture:
            return None
        block = next((n for n, m in model.named_modules()
                      if type(m).__name__ == "ImprintBlock"), None)
        if block is None:
            return None
        return (f"vet: the model carries an imprint block ({block!r}), an architecture "
                "designed to read single inputs out of updates (the architecture test judges "
                "the model itself: pass vet:architecture=false to run the other tests, or use a "
                "model without the block)")

    def inspect(
        self,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        images: torch.Tensor,
    ) -> str | None:
        """Return the first enabled test that fires on θ (module docstring), or None.

        In order: ``architecture``, ``classifier``, ``rows``, then ``activation`` on the
        user's own ``images``; the reason names the layer, the figure and the attack it looks
        like.
        """
        cfg = self.config
        refused = self.refuses_model(model)
        if refused is not None:
            return refused
        layers = linear_weights(model, parameters)
        if cfg.classifier and layers:
            name, _, weight = layers[-1]
            norms = weight.detach().double().norm(dim=1)
            if norms.numel() >= 2 and float(norms.median()) > 0:
                ratio = float(norms.max() / norms.median())
                if ratio >= cfg.max_row_ratio:
                    return (f"vet: row {int(norms.argmax())} of classifier {name!r} is "
                            f"{ratio:.1f} times the median row's length (>= "
                            f"{cfg.max_row_ratio:g}); θ looks crafted to single out a class or "
                            "feature (fishing)")
        if cfg.rows:
            for name, _, weight in layers:
                for what, matrix in (("rows", weight), ("columns", weight.T)):
                    if matrix.shape[1] < MIN_DIMENSION:
                        continue
                    cosine = max_abs_cosine(matrix)
                    if cosine >= cfg.max_cosine:
                        return (f"vet: two {what} of linear layer {name!r} point the same way "
                                f"(|cos| = {cosine:.4f} >= {cfg.max_cosine}); θ looks crafted "
                                "to bin inputs (imprint)")
        if cfg.activation:
            for name, rate in unit_activation_rate(model, parameters, buffers, images).items():
                if rate < cfg.min_activation:
                    return (f"vet: the units of linear layer {name!r} fire for {rate:.1%} of "
                            f"this batch's inputs on average (< {cfg.min_activation:.0%}); θ "
                            "looks crafted to trap single inputs (trap weights)")
        return None
