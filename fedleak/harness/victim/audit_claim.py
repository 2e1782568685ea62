"""What a victim's defense chain claims for one audit trial: the accountant's ε for the canary.

An audit compares its ε lower bound with the ε the defenses claim for what one trial covers —
the canary's presence in one round of the user:

- **per-example defense (DP-SGD)**, gradient or input canary: the canary is one example, so the
  claim is DP-SGD's own accountant (Opacus RDP or PRV) over the steps that may hold it: with
  fixed batches one step per epoch at q = 1 (FedSGD: one step), with Poisson sampling every
  step at rate q;
- **update defenses only** (and every canary client): the canary moves what enters the chain
  by at most r — ‖c‖ for a gradient canary or a canary client, unbounded for an input canary
  (one example can change an unclipped update arbitrarily). Each update defense's
  :class:`~fedleak.defenses.stages.GaussianClaim` then applies in order: clipping to S leaves
  the inputs at most min(r, 2S) apart (projection is 1-Lipschitz), the first Gaussian noise of
  std s makes the trial a Gaussian mechanism with μ = r / s_total, where s_total = s·√k when
  the server sees the sum of k users' noisy updates (secure aggregation), and everything after
  it is post-processing. A defense that claims nothing (prune, quantise, Laplace noise, a
  remote service without a claim) before the noise leaves r unbounded. ε is exact for a
  Gaussian mechanism (Gaussian DP, :func:`fedleak.auditing.epsilon_from_mu`); no noise means
  no claim (ε = ∞).

A claim is what the chain says it does; an audit's bound above it is a violation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedleak.auditing import epsilon_from_mu
from fedleak.auditing.canaries import CLIENT, INPUT
from fedleak.defenses import DefenseChain
from fedleak.defenses.dpsgd import DPSGD, epsilon, make_accountant
from fedleak.harness.federated.protocol import FEDSGD, Protocol

#: δ of an audit when neither the request nor the chain says.
DEFAULT_DELTA = 1e-5


@dataclass(frozen=True)
class TrialClaim:
    """The claimed (ε, δ) of one trial, what it accounts and with which accountant."""

    epsilon: float
    delta: float
    mechanism: str
    accountant: str
    mu: float | None = None


def chain_delta(chain: DefenseChain) -> float:
    """The δ the chain's accountants report (the first that has one), else 1e-5."""
    for defense in chain.defenses:
        delta = getattr(defense.config, "delta", None)
        if isinstance(delta, float) and 0 < delta < 1:
            return delta
    return DEFAULT_DELTA


def trial_claim(chain: DefenseChain, canary: str, canary_norm: float, protocol: Protocol,
                num_images: int, noise_users: int, delta: float) -> TrialClaim:
    """The chain's claim for one trial of ``canary`` (module docstring); ``noise_users`` is
    how many users' noisy updates the server's view sums (1 without secure aggregation)."""
    if chain.per_example is not None and canary != CLIENT:
        return _per_example_claim(chain, protocol, num_images, delta)
    return _update_claim(chain, canary, canary_norm, noise_users, delta)


def _per_example_claim(chain: DefenseChain, protocol: Protocol, num_images: int,
                       delta: float) -> TrialClaim:
    defense = chain.per_example
    if not isinstance(defense, DPSGD):
        name = defense.name if defense is not None else "?"
        return TrialClaim(math.inf, delta, f"per-example defense {name} claims no accounting",
                          "none")
    c = defense.config
    q = defense.sample_rate(num_images, protocol.batch_size)
    epochs = 1 if protocol.kind == FEDSGD else protocol.local_epochs
    if q is None:
        rate, steps = 1.0, epochs  # the canary sits in one fixed batch per epoch
        where = f"{steps} step(s) holding the canary (fixed batches, q = 1)"
    else:
        rate = q
        steps = 1 if protocol.kind == FEDSGD else epochs * max(1, round(1 / q))
        where = f"{steps} step(s), each holding the canary with probability q = {q:.4g}"
    accountant = make_accountant(c.accountant)
    accountant.history.append((c.noise_multiplier, rate, steps))
    return TrialClaim(epsilon(accountant, delta), delta,
                      f"DP-SGD per example: noise multiplier σ = {c.noise_multiplier:g}, "
                      f"clip C = {c.max_grad_norm:g}, {where}", c.accountant)


def _update_claim(chain: DefenseChain, canary: str, canary_norm: float, noise_users: int,
                  delta: float) -> TrialClaim:
    distance = math.inf if canary == INPUT else canary_norm
    steps = ["an input canary moves an unclipped update without bound" if canary == INPUT
             else f"the canary moves the update by ‖c‖ = {canary_norm:g}"]
    noise = 0.0
    for defense in chain.update:
        claim = defense.gaussian_claim()
        if claim is None:
            if not math.isinf(distance):
                steps.append(f"{defense.name} claims nothing, so the distance is unbounded")
            distance = math.inf
            continue
        if claim.clip_norm is not None:
            distance = claim.distance_after_clip(distance)
            steps.append(f"{defense.name} clips to {claim.clip_norm:g}: at most "
                         f"{distance:g} apart")
        if claim.noise_std > 0:
            noise = claim.noise_std * math.sqrt(max(noise_users, 1))
            summed = f" (summed over {noise_users} users)" if noise_users > 1 else ""
            steps.append(f"{defense.name} adds N(0, s²), s = {noise:.4g}{summed}")
            break  # everything after the first noise is post-processing
    if noise == 0 or math.isinf(distance):
        why = "no Gaussian noise" if noise == 0 else "an unbounded distance before the noise"
        return TrialClaim(math.inf, delta, "; ".join(steps) + f" — {why}: no claim", "none")
    mu = distance / noise
    return TrialClaim(epsilon_from_mu(mu, delta), delta,
                      "; ".join(steps) + f" — a Gaussian mechanism with μ = {mu:.4g}",
                      "gaussian-dp (exact)", mu)
