"""The typed measurements of one sweep point, as the results store keeps them (JSON).

A point has at most one :class:`AttackMeasurement` (leakage over K attacked rounds), one
:class:`UtilityMeasurement` (test accuracy after federated training through the defended path)
and, when the spec has an ``[sweep.audit]`` table, one :class:`AuditMeasurement` (ε lower bounds
from the audit game beside the ε the chain claims). Each is written to the store with
:meth:`to_json` the moment it finishes, and read back with :meth:`from_json`, which ignores
keys it does not know and leaves missing optional ones unset, so stores written by other
fedleak versions still load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedleak.harness.metrics.floors import NOTHING_RECOVERED

M = TypeVar("M")


def _from_json(cls: type[M], data: dict[str, Any]) -> M:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RoundMeasurement:
    """One attacked round: its scores, the victim's ε after it, its pictures (run-relative)."""

    mean_psnr: float | None = None
    mean_ssim: float | None = None
    label_accuracy: float | None = None
    epsilon_total: float | None = None
    files: dict[str, str] = field(default_factory=dict)
    #: the round's trivial floor (mean over its images of the best constant guess's PSNR)
    floor_psnr: float | None = None


@dataclass
class AttackMeasurement:
    """Leakage of one point: the attack's means over K rounds, and what the victim ran."""

    attack: str
    model: str
    dataset: str
    run: str
    images: int = 0
    mean_psnr: float | None = None
    mean_ssim: float | None = None
    label_accuracy: float | None = None
    wall_time_s: float = 0.0
    rounds: list[RoundMeasurement] = field(default_factory=list)
    epsilon: float | None = None
    delta: float | None = None
    defenses: list[str] = field(default_factory=list)
    measure_time_s: float = 0.0
    mean_feature_cosine: float | None = None
    mean_feature_relative_error: float | None = None
    node: str | None = None  # the Ray node that measured it (--ray)
    #: which server attacked: honest, malicious-parameters, malicious-architecture
    server_role: str = "honest"
    #: images recovered exactly (PSNR >= 40 dB) over the point's rounds
    exact: int | None = None
    #: success at a PSNR threshold (:mod:`fedleak.harness.metrics.success_bounds`): images at
    #: success_psnr dB or above, their share, κ of the public prior (and its upper end) and the
    #: DP bound β(κ) of the attacked rounds' mechanism (σ, q, T), with its method
    success_psnr: float | None = None
    successes: int | None = None
    success_rate: float | None = None
    kappa: float | None = None
    kappa_upper: float | None = None
    reconstruction_bound: float | None = None
    reconstruction_bound_se: float | None = None
    bound_method: str | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    dp_steps: int | None = None
    #: mean Fisher-information PSNR ceiling of the attacked images (the victim's, Guo et al.)
    fisher_psnr_ceiling: float | None = None
    #: the public prior's mean image scored on the public prior (mean PSNR): the biased
    #: baseline the Fisher ceiling is read against (:mod:`~fedleak.harness.metrics.success_bounds`)
    prior_psnr: float | None = None
    #: the trivial floors beside the figures (:mod:`~fedleak.harness.metrics.floors`): the
    #: mean over the attacked images of the best constant guess's PSNR and SSIM, the mean
    #: margin of the attack's PSNR above it, and the images above their floor by its margin
    floor_psnr: float | None = None
    floor_ssim: float | None = None
    floor_margin: float | None = None
    above_floor: int | None = None
    #: the rounds a safety time limit cut short, each with its reason: a point with any is
    #: truncated, not a measurement (left out of every chart, table figure and worst case)
    truncated: list[str] = field(default_factory=list)
    #: text points: mean ROUGE-1/2/L over the attacked sentences (matched one-to-one),
    #: sentences recovered exactly, and the token set's mean precision and recall
    rouge1: float | None = None
    rouge2: float | None = None
    rougeL: float | None = None  # noqa: N815 - the metric's own name
    exact_sentences: int | None = None
    token_precision: float | None = None
    token_recall: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttackMeasurement:
        made = _from_json(cls, data)
        made.rounds = [_from_json(RoundMeasurement, r) for r in data.get("rounds", [])]
        return made


@dataclass
class UtilityMeasurement:
    """Utility of one point: test accuracy along federated training, and the ε it cost."""

    test_accuracy: float
    initial_accuracy: float
    curve: list[tuple[int, float]]
    rounds: int
    batch_size: int
    lr: float
    schedule: str
    protocol: str
    epsilon: float | None = None
    delta: float | None = None
    defenses: list[str] = field(default_factory=list)
    test_images: int = 0
    training_time_s: float = 0.0
    node: str | None = None  # the Ray node that measured it (--ray)
    #: language models: test perplexity (exp of the mean next-token cross-entropy) along the
    #: same curve's ends; ``test_accuracy`` is then next-token accuracy
    perplexity: float | None = None
    initial_perplexity: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UtilityMeasurement:
        made = _from_json(cls, data)
        made.curve = [(int(r), float(a)) for r, a in made.curve]
        return made


@dataclass
class AuditMeasurement:
    """ε lower bounds of one point: the audit game (docs/audit.md) against the point's victim.

    The shape other code reads (kept simple on purpose):

    - ``epsilon_lb``: estimator → ε_LB, lower bounds only (``clopper-pearson``,
      ``gaussian-dp``, ``one-run``), each at ``confidence`` and ``delta``;
    - ``estimates``: estimator → ε estimate with no guarantee (``one-shot``);
    - ``epsilon_claimed``: the chain's accountant ε for what one trial covers, None when the
      chain claims no DP for the canary (ε = ∞);
    - ``trials`` (``trials_in`` / ``trials_out`` of them evaluated by the bounds), ``canary``,
      ``threat_model``, ``threshold_rule``; ``violation`` when a bound exceeds the claim.
    """

    epsilon_lb: dict[str, float]
    confidence: float
    trials: int
    delta: float
    canary: str
    estimates: dict[str, float] = field(default_factory=dict)
    epsilon_claimed: float | None = None
    trials_in: int = 0
    trials_out: int = 0
    threat_model: str = ""
    threshold_rule: str = ""
    accountant: str = ""
    violation: bool = False
    run: str = ""
    wall_time_s: float = 0.0
    node: str | None = None  # the Ray node that measured it (--ray)

    @property
    def best(self) -> tuple[str, float] | None:
        """(estimator, ε_LB) of the largest lower bound, or None."""
        if not self.epsilon_lb:
            return None
        name = max(self.epsilon_lb, key=lambda k: self.epsilon_lb[k])
        return name, self.epsilon_lb[name]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditMeasurement:
        return _from_json(cls, data)


def float_or_none(text: str | None) -> float | None:
    """A victim's metadata value (a string) as a float, or None when absent or not a number."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def done_line(label: str, point_id: str, attack: AttackMeasurement | None,
              utility: UtilityMeasurement | None, where: str = "",
              audit: AuditMeasurement | None = None) -> str:
    """The line printed when a point is done: its figures (and where it was measured)."""
    parts = ["no attack"]
    if attack is not None and attack.truncated:
        parts = [f"TRUNCATED: {len(attack.truncated)} round(s) cut by the attack's safety "
                 "time limit, not a measurement"]
    elif attack is not None and (attack.rouge1 is not None or attack.token_recall is not None):
        parts = [f"ROUGE-1 {attack.rouge1:.3f}, ROUGE-2 {attack.rouge2:.3f}"
                 if attack.rouge1 is not None and attack.rouge2 is not None else
                 f"token set P {attack.token_precision:.3f} R {attack.token_recall:.3f}"]
    elif attack is not None and attack.mean_psnr is not None and attack.mean_ssim is not None:
        parts = [f"PSNR {attack.mean_psnr:.2f} dB, SSIM {attack.mean_ssim:.3f}"]
        if attack.floor_psnr is not None:
            parts.append(f"floor {attack.floor_psnr:.2f} dB" + (
                f" ({NOTHING_RECOVERED})" if attack.above_floor == 0 else
                f" ({attack.above_floor} of {attack.images} image(s) above it)"))
    if utility is not None:
        parts.append(f"test accuracy {utility.test_accuracy:.1%}")
        if utility.perplexity is not None:
            parts.append(f"perplexity {utility.perplexity:.4g}")
    eps = (utility.epsilon if utility else None) or (attack.epsilon if attack else None)
    if eps is not None:
        parts.append(f"ε {eps:.4g}")
    best = audit.best if audit is not None else None
    if best is not None:
        parts.append(f"ε_LB {best[1]:.3g} ({best[0]})" + (" VIOLATION" if audit is not None
                                                          and audit.violation else ""))
    return f"done {label} [{point_id}]{where}: " + ", ".join(parts)
