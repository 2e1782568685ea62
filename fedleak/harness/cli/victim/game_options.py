"""What a server or evaluator may ask of the victim beyond rounds: "Scoring and reveal",
"Audit games" and "Model release" of ``fedleak victim serve --help``."""

from __future__ import annotations

from dataclasses import dataclass

import click

from fedleak.harness.cli.options import F, packed

#: Default of --image-score-budget (fedleak.harness.victim.scoring.budget.DEFAULT_IMAGE_BUDGET; a
#: literal here so the CLI starts without importing the victim).
DEFAULT_IMAGE_BUDGET = 8
#: Defaults of --audit-budget and --max-audit-trials (fedleak.harness.victim.limits).
DEFAULT_AUDIT_BUDGET = 16
DEFAULT_MAX_AUDIT_TRIALS = 20_000


@dataclass(frozen=True)
class ScoringOptions:
    """How much Score may tell, and whether Reveal answers."""

    allow_reveal: bool
    score_budget: int
    image_score_budget: int


def scoring_options(function: F) -> F:
    """The scoring options, handed to the command as ``scoring``."""
    return packed(ScoringOptions, "scoring", [
        click.option("--allow-reveal", is_flag=True,
                     help="Allow Reveal (ground truth for reports) to callers holding the "
                          "token."),
        click.option("--score-budget", default=1, show_default=True, type=click.IntRange(1),
                     help="Submissions Score accepts per round (per user set) and per release; "
                          "a submission is final. More than 1 makes Score an oracle: research "
                          "only."),
        click.option("--image-score-budget", default=DEFAULT_IMAGE_BUDGET, show_default=True,
                     type=click.IntRange(1),
                     help="Scores that may depend on one private image over the victim's life "
                          "(every round, user set and release it belongs to): bounds what Score "
                          "can tell about an image. See docs/security.md."),
    ])(function)


@dataclass(frozen=True)
class AuditOptions:
    """The games the victim plays with its secret coins: the audit and the informed adversary."""

    allow_audit: bool
    audit_budget: int
    max_audit_trials: int
    informed_candidates: int
    informed_known: int


def audit_options(function: F) -> F:
    """The audit-game options, handed to the command as ``audit``."""
    return packed(AuditOptions, "audit", [
        click.option("--allow-audit", is_flag=True,
                     help="Play the audit game (BeginAudit): secret coins, synthetic canaries "
                          "before the defense chain, ε lower bounds from the server's scores "
                          "(`fedleak audit`, docs/audit.md)."),
        click.option("--audit-budget", default=DEFAULT_AUDIT_BUDGET, show_default=True,
                     type=click.IntRange(1),
                     help="Audits answered over the victim's life (each answer is final)."),
        click.option("--max-audit-trials", default=DEFAULT_MAX_AUDIT_TRIALS, show_default=True,
                     type=click.IntRange(1), help="The most trials one audit may run."),
        click.option("--informed-candidates", default=0, show_default=True,
                     type=click.IntRange(0),
                     help="Play the informed-adversary game (BeginInformedTrial, `fedleak "
                          "informed-adversary`): N public candidates per trial from the data "
                          "set's other split, the target picked by a secret coin (κ = 1/N); 0: "
                          "no game."),
        click.option("--informed-known", default=0, show_default=True, type=click.IntRange(0),
                     help="Known (public) records trained beside the game's target."),
    ])(function)


@dataclass(frozen=True)
class ReleaseOptions:
    """The model release (Release RPC, the kkt attack's threat model)."""

    release_size: int
    release_lr: float
    release_epochs: int
    release_target_loss: float


def release_options(function: F) -> F:
    """The model-release options, handed to the command as ``release``."""
    return packed(ReleaseOptions, "release", [
        click.option("--release-size", default=0, show_default=True, type=click.IntRange(0),
                     help="Model release (Release RPC, the kkt attack's threat model): "
                          "training-set size n, balanced over the data set's binary task (0: "
                          "the whole pool). Needs a one-output model such as kkt-mlp."),
        click.option("--release-lr", default=0.5, show_default=True,
                     type=click.FloatRange(0, min_open=True),
                     help="Release: gradient-descent step size (a server may ask for another)."),
        click.option("--release-epochs", default=20000, show_default=True,
                     type=click.IntRange(1),
                     help="Release: epoch budget, also the most a server may ask for."),
        click.option("--release-target-loss", default=1e-5, show_default=True,
                     type=click.FloatRange(0), help="Release: stop at this mean logistic loss."),
    ])(function)
