"""What a victim's defense chain claims for one audit trial, read from its declarations.

An audit compares its ε lower bound with the ε the chain *declares* for what one trial covers —
the canary's presence in one round of the user. Only declarations are read
(:meth:`~fedleak.defenses.stages.Defense.mechanism`), never a defense's class, so a plug-in
that declares what ``dpsgd`` declares gets exactly ``dpsgd``'s claim:

- **a per-example Gaussian mechanism** (clip S, noise std s on each step's sum: z = s / S),
  gradient or input canary: the canary is one example. With fixed or shuffled batches it sits in
  one step per epoch: a Gaussian mechanism with μ = √E / z, exact by Gaussian-DP composition
  (FedSGD: E = 1); with Poisson sampling every one of the round's T steps holds it with
  probability q: the Poisson-subsampled Gaussian, its ε from the PRV accountant (Gopi et al.
  2021, numerically tight). The declared accountant's own (looser) ε is reported beside it;
- **the update stage** (and every canary client): the canary moves what enters it by at most r
  (‖c‖; an input canary: unbounded); the declared clips bound the distance when the first
  Gaussian noise is added — by 2S for a canary added to the user's own update (two updates of
  one user), by S for a canary client (its absence is the zero update)
  (:class:`~fedleak.defenses.composition.UpdateComposition`), and the noise's std on what the
  server sees (s·√(k/n) for k users of n declared shares, s·√k for k users adding s each)
  makes the trial a Gaussian mechanism with μ = distance / std, ε exact.
  A defense that declares nothing before the noise, or no noise, means no claim (ε = ∞).

The claim's ε is the *tight* ε of the declared trial mechanism: a bound above it means the
implementation is not the declared mechanism, whatever slack the accountant has.
:meth:`TrialClaim.epsilon_at` gives the ε of the same family with the noise divided by a
factor r — what the declaration tests' bounds are stated in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedleak.auditing import epsilon_from_mu
from fedleak.auditing.canaries import CLIENT, INPUT
from fedleak.defenses import DefenseChain
from fedleak.defenses.accounting import accounted, epsilon, make_accountant
from fedleak.defenses.composition import trial_noise_std
from fedleak.harness.federated.protocol import FEDSGD, Protocol

#: δ of an audit when neither the request nor the chain says.
DEFAULT_DELTA = 1e-5


@dataclass(frozen=True)
class TrialClaim:
    """The claimed (ε, δ) of one trial: the declared trial mechanism, in words and numbers."""

    epsilon: float
    delta: float
    mechanism: str
    accountant: str
    #: Gaussian trial (fixed batches, update stage): its μ
    mu: float | None = None
    #: Poisson per-example trial: noise multiplier z, rate q and the T steps that may hold it
    sigma: float | None = None
    sample_rate: float | None = None
    steps: int = 1
    #: the declared accountant's ε for the same trial (an upper bound on ``epsilon``)
    reported_epsilon: float | None = None

    @property
    def claims(self) -> bool:
        return math.isfinite(self.epsilon)

    def epsilon_at(self, ratio: float) -> float:
        """ε at δ of the declared family with its noise divided by ``ratio`` (μ × ratio)."""
        if not self.claims or ratio <= 0:
            return 0.0 if ratio <= 0 else self.epsilon
        if math.isinf(ratio):
            return math.inf
        if self.mu is not None:
            return epsilon_from_mu(self.mu * ratio, self.delta)
        assert self.sigma is not None and self.sample_rate is not None
        accountant = make_accountant("prv")
        accountant.history.append((self.sigma / ratio, self.sample_rate, self.steps))
        return epsilon(accountant, self.delta)


def chain_delta(chain: DefenseChain) -> float:
    """The δ the chain's declarations report (the first that accounts), else 1e-5."""
    return chain.delta(DEFAULT_DELTA)


def trial_claim(chain: DefenseChain, canary: str, canary_norm: float, protocol: Protocol,
                num_images: int, noise_users: int, delta: float,
                names: Sequence[str] = ()) -> TrialClaim:
    """The chain's claim for one trial of ``canary`` (module docstring); ``noise_users`` is
    how many users' noisy updates the server's view sums (1 without secure aggregation)."""
    if chain.per_example is not None and canary != CLIENT:
        return _per_example_claim(chain, protocol, num_images, delta)
    return _update_claim(chain, canary, canary_norm, noise_users, delta, names)


def _per_example_claim(chain: DefenseChain, protocol: Protocol, num_images: int,
                       delta: float) -> TrialClaim:
    mechanism = chain.per_example_mechanism
    name = chain.per_example.name if chain.per_example is not None else "?"
    got = accounted(mechanism)
    if mechanism is None or got is None:
        return TrialClaim(math.inf, delta, f"per-example defense {name} declares no clipped "
                          "Gaussian mechanism", "none")
    z = got.noise_multiplier
    q = mechanism.sampling.poisson_rate(num_images, protocol.batch_size)
    epochs = 1 if protocol.kind == FEDSGD else protocol.local_epochs
    clip = mechanism.clip
    assert clip is not None  # accounted() needs one
    declared = (f"{name} declares per example: {clip.geometry} clip to {clip.norm:g}, noise "
                f"multiplier z = {z:g}")
    reported = make_accountant(mechanism.accountant if mechanism.accountant in ("rdp", "prv")
                               else "rdp")
    if q is None:
        steps = epochs
        mu = math.sqrt(steps) / z if z > 0 else math.inf
        reported.history.append((z, 1.0, steps))
        where = (f"{steps} step(s) holding the canary ({mechanism.sampling.kind} batches, "
                 "q = 1)")
        return TrialClaim(epsilon_from_mu(mu, delta), delta, f"{declared}, {where} — a "
                          f"Gaussian mechanism with μ = {mu:.4g}", "gaussian-dp (exact)", mu=mu,
                          steps=steps, reported_epsilon=epsilon(reported, delta))
    steps = 1 if protocol.kind == FEDSGD else epochs * max(1, round(1 / q))
    tight = make_accountant("prv")
    tight.history.append((z, q, steps))
    reported.history.append((z, q, steps))
    return TrialClaim(epsilon(tight, delta), delta,
                      f"{declared}, {steps} step(s) each holding the canary with probability "
                      f"q = {q:.4g} (Poisson)", "prv", sigma=z, sample_rate=q,
                      steps=steps, reported_epsilon=epsilon(reported, delta))


def _update_claim(chain: DefenseChain, canary: str, canary_norm: float, noise_users: int,
                  delta: float, names: Sequence[str]) -> TrialClaim:
    composition = chain.update_composition()
    distance = math.inf if canary == INPUT else canary_norm
    steps = ["an input canary moves an unclipped update without bound" if canary == INPUT
             else f"the canary moves the update by ‖c‖ = {canary_norm:g}"]
    steps += list(composition.words)
    if not composition.gaussian:
        why = composition.unbounded or "no Gaussian noise"
        return TrialClaim(math.inf, delta, "; ".join(steps) + f" — {why}: no claim", "none")
    distance = composition.distance(distance, names, from_zero=canary == CLIENT)
    noise = trial_noise_std(composition, noise_users)
    if noise_users > 1:
        steps.append(f"the server sees the sum of {noise_users} users: s = {noise:.4g}")
    if math.isinf(distance):
        return TrialClaim(math.inf, delta, "; ".join(steps) + " — an unbounded distance before "
                          "the noise: no claim", "none")
    mu = distance / noise
    return TrialClaim(epsilon_from_mu(mu, delta), delta,
                      "; ".join(steps) + f" — a Gaussian mechanism with μ = {mu:.4g}",
                      "gaussian-dp (exact)", mu)
