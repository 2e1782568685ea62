"""audit.png draws the victim's equal-count bins as a density, names every ε bar's group,
and the audit's defaults are one set everywhere they are read."""

from __future__ import annotations

import numpy as np

from fedleak.auditing import AuditBound
from fedleak.harness.attacker.games.audit_picture import bar_label, score_density


def test_bins_of_unequal_width_are_a_density_of_area_one() -> None:
    widths = np.array([2.5, 0.12, 0.12, 2.5])
    density = score_density([25, 25, 25, 25], widths)
    assert abs(float((density * widths).sum()) - 1) < 1e-12
    assert density[1] > density[0] * 20  # the narrow middle bins are the dense ones


def test_every_bar_names_its_group() -> None:
    bound = AuditBound("gaussian-scores", 2.0, False, 0.99999, 10, 10, 1e-5, "c", "t", "none",
                       group="layers.1.bias")
    assert bar_label(bound) == "gaussian-scores · layers.1.bias"


def test_the_audit_defaults_are_one_set() -> None:
    from fedleak.auditing.audit_defaults import (
        DEFAULT_CONFIDENCE,
        DEFAULT_FALSE_ALARM,
        DEFAULT_POWER,
        DEFAULT_SHORTFALL,
    )
    from fedleak.auditing.estimator_registry import Game, GameSettings
    from fedleak.harness.attacker.games.audit_trials import AuditSettings
    from fedleak.harness.cli.audit_command import audit as audit_command
    from fedleak.harness.victim.audit.request import AuditRequest

    checked = AuditRequest().checked(100, False)
    settings = AuditSettings()
    game = Game(np.zeros(1), np.zeros(1, bool), np.zeros(1, bool),
                GameSettings(0.0, 0.95, "c", "t"))
    options = {p.name: p.default for p in audit_command.params}
    for value, default in [(checked.power, DEFAULT_POWER), (settings.power, DEFAULT_POWER),
                           (game.power, DEFAULT_POWER), (options["power"], DEFAULT_POWER),
                           (checked.false_alarm, DEFAULT_FALSE_ALARM),
                           (game.false_alarm, DEFAULT_FALSE_ALARM),
                           (options["false_alarm"], DEFAULT_FALSE_ALARM),
                           (settings.detect_shortfall, DEFAULT_SHORTFALL),
                           (options["detect_shortfall"], DEFAULT_SHORTFALL),
                           (settings.confidence, DEFAULT_CONFIDENCE),
                           (options["confidence"], DEFAULT_CONFIDENCE)]:
        assert value == default
