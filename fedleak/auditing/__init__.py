"""Auditing: ε lower bounds from distinguishing games and reconstruction bounds, as plain maths.

A room beside ``attacks/`` and ``defenses/`` (numpy, scipy, torch; it imports nothing of the
harness): the estimators, one per module — :mod:`~fedleak.auditing.estimators.clopper_pearson`
(Jagielski et al. 2020, Nasr et al. 2021), :mod:`~fedleak.auditing.estimators.gaussian_dp` (Nasr et
al. 2023), :mod:`~fedleak.auditing.estimators.one_run` (Steinke, Nasr & Jagielski 2023),
:mod:`~fedleak.auditing.estimators.subsampled_gaussian` (Poisson mixtures),
:mod:`~fedleak.auditing.estimators.noise_ratio` (the declared mechanism tested over many canaries,
with its power), :mod:`~fedleak.auditing.estimators.one_shot` (Andrew et al. 2024, an estimate) —
registered by name (:mod:`~fedleak.auditing.estimator_registry`;
:mod:`~fedleak.auditing.estimators.primary`,
:mod:`~fedleak.auditing.estimators.declared_mechanism`), decided together
(:mod:`~fedleak.auditing.verdict`: Holm over every test) — the game's statistics
(:mod:`~fedleak.auditing.game`, :mod:`~fedleak.auditing.thresholds`), the canaries
(:mod:`~fedleak.auditing.canaries`) and what a result carries
(:mod:`~fedleak.auditing.result`). The harness plays the game over the wire
(docs/audit.md).

From the other side, reconstruction bounds from a mechanism's DP
(:mod:`~fedleak.auditing.reconstruction.bounds`), the Fisher-information ceiling on
reconstruction error (:mod:`~fedleak.auditing.reconstruction.fisher_information`), the baseline κ of
a prior (:mod:`~fedleak.auditing.reconstruction.prior_baseline`) and the statistics of repeated
games (:mod:`~fedleak.auditing.game_statistics`); docs/bounds.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and readers
    from fedleak.auditing.estimator_registry import (
        ESTIMATOR_REGISTRY,
        Estimator,
        Findings,
        Game,
        register_estimator,
    )
    from fedleak.auditing.estimators.clopper_pearson import clopper_pearson_epsilon, upper_bound
    from fedleak.auditing.estimators.gaussian_dp import (
        epsilon_from_mu,
        mu_from_epsilon,
        mu_lower_bound,
    )
    from fedleak.auditing.estimators.noise_ratio import StreamTable
    from fedleak.auditing.estimators.one_run import one_run_epsilon
    from fedleak.auditing.estimators.one_shot import epsilon_two_gaussians, one_shot_epsilon
    from fedleak.auditing.game import (
        GameSettings,
        ScoreHistogram,
        audit_bounds,
        calibration_split,
        score_histogram,
    )
    from fedleak.auditing.result import ESTIMATORS, AuditBound, DeclarationTest, format_epsilon
    from fedleak.auditing.verdict import Evaluation, estimator_names, evaluate, verdict_text

#: each public name and the module that defines it: loaded on first use (PEP 562), so that
#: importing one estimator does not import scipy through all of them (process start-up)
_WHERE = {
    "AuditBound": "fedleak.auditing.result",
    "DeclarationTest": "fedleak.auditing.result",
    "ESTIMATORS": "fedleak.auditing.result",
    "ESTIMATOR_REGISTRY": "fedleak.auditing.estimator_registry",
    "Estimator": "fedleak.auditing.estimator_registry",
    "Evaluation": "fedleak.auditing.verdict",
    "Findings": "fedleak.auditing.estimator_registry",
    "Game": "fedleak.auditing.estimator_registry",
    "GameSettings": "fedleak.auditing.game",
    "ScoreHistogram": "fedleak.auditing.game",
    "StreamTable": "fedleak.auditing.estimators.noise_ratio",
    "audit_bounds": "fedleak.auditing.game",
    "calibration_split": "fedleak.auditing.game",
    "clopper_pearson_epsilon": "fedleak.auditing.estimators.clopper_pearson",
    "epsilon_from_mu": "fedleak.auditing.estimators.gaussian_dp",
    "epsilon_two_gaussians": "fedleak.auditing.estimators.one_shot",
    "estimator_names": "fedleak.auditing.verdict",
    "evaluate": "fedleak.auditing.verdict",
    "format_epsilon": "fedleak.auditing.result",
    "mu_from_epsilon": "fedleak.auditing.estimators.gaussian_dp",
    "mu_lower_bound": "fedleak.auditing.estimators.gaussian_dp",
    "one_run_epsilon": "fedleak.auditing.estimators.one_run",
    "one_shot_epsilon": "fedleak.auditing.estimators.one_shot",
    "register_estimator": "fedleak.auditing.estimator_registry",
    "score_histogram": "fedleak.auditing.game",
    "upper_bound": "fedleak.auditing.estimators.clopper_pearson",
    "verdict_text": "fedleak.auditing.verdict",
}


def __getattr__(name: str) -> Any:
    """Return the public name ``name``, imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'fedleak.auditing' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_REGISTRY",
    "AuditBound",
    "DeclarationTest",
    "Estimator",
    "Evaluation",
    "Findings",
    "Game",
    "StreamTable",
    "estimator_names",
    "evaluate",
    "register_estimator",
    "verdict_text",
    "GameSettings",
    "ScoreHistogram",
    "audit_bounds",
    "calibration_split",
    "clopper_pearson_epsilon",
    "epsilon_from_mu",
    "epsilon_two_gaussians",
    "format_epsilon",
    "mu_from_epsilon",
    "mu_lower_bound",
    "one_run_epsilon",
    "one_shot_epsilon",
    "score_histogram",
    "upper_bound",
]
