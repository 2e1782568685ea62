"""Test whether the noise depends on the data (``canary-free``).

The noise level of canary-free releases of the
user's own batch against the declared scale (``canary-free``).

The coverage canaries sit at the clip bound in every trial, so a mechanism whose noise scale
is read off the batch — std σ·max_i ‖ḡ_i‖ instead of σC, a clip bound computed from the
batch's norms, noise switched on by a large gradient — releases exactly the declared noise
while the canaries are there, and less on the user's real batch alone. The declared
mechanism's noise does not depend on the data: s on every release. So the audit interleaves,
at secret positions, releases with no canary at all (the *canary-free phase*; they are not
scored), and tests their spread with the χ² test of
:mod:`~fedleak.auditing.estimators.noise_level`, per tensor and pooled, one-sided: Q/s² over
ν = Σ_c (n_c − 1) degrees of freedom is χ²_ν when the noise is as declared, and f² χ²_ν when
it is f·s.
"""

from __future__ import annotations

from fedleak.auditing.estimator_registry import (
    Estimator,
    Findings,
    Game,
    NoOptions,
    register_estimator,
)
from fedleak.auditing.estimators.noise_level import noise_test
from fedleak.auditing.result import CANARY_FREE, DeclarationTest

POOLED = "all tensors pooled"


def _groups(game: Game) -> list[tuple[str, list[str]]]:
    table = game.streams
    if table is None or table.bare_noise is None or not game.claims:
        return []
    names = list(table.bare_noise.groups)
    out = [(g, [g]) for g in names]
    if len(names) > 1:
        out.insert(0, (POOLED, names))
    return out


@register_estimator(CANARY_FREE)
class CanaryFree(Estimator):
    """χ² tests of the noise on canary-free releases, per tensor and pooled."""

    Config = NoOptions

    def tests(self, game: Game) -> int:
        """Return one test per tensor with canary-free samples, and the pooled one."""
        return len(_groups(game))

    def run(self, game: Game, level: float) -> Findings:
        """Return the χ² tests of the canary-free releases' noise at ``level``."""
        table = game.streams
        found = Findings()
        if table is None or table.bare_noise is None:
            return found
        for name, members in _groups(game):
            dof, squares = table.bare_noise.pooled(members)
            test = noise_test(name, dof, squares, level, game.power)
            if test is None:
                continue
            found.tests.append(DeclarationTest(
                CANARY_FREE, name, test.p_value, False,
                f"{name}: on {table.bare_releases} canary-free releases of the user's own "
                f"batch the noise is {test.factor:.3g}× the declared std (at most "
                f"{test.factor_upper:.3g}×, {int(test.dof)} degrees of freedom): noise that "
                "depends on the data (calibrated to the batch, a clip bound computed from "
                "it, or noise switched by it)",
                samples_out=int(test.dof), detectable_noise=test.detectable_noise,
                power=game.power, level=level,
                ratio=1 / test.factor if test.factor > 0 else float("inf"),
                ratio_lower=1 / test.factor_upper if test.factor_upper > 0 else float("inf")))
        return found
