"""Client-level DP for federated averaging: the user's whole update is the unit of privacy.

McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models", Algorithm 1
(DP-FedAvg).

Each round the user clips its finished update Δ (all parameters together) to L2 norm S and
adds Gaussian noise::

    Δ̄ = Δ · min(1, S / ‖Δ‖₂)
    local:        Δ̃   = Δ̄   + N(0, σ² S² I)          the user adds all the noise itself
    distributed:  Δ̃_u = Δ̄_u + N(0, σ² S² I / n)      each of n users adds a share, so the sum
                                                      that secure aggregation reveals is
                                                      Σ_u Δ̄_u + N(0, σ² S² I)

The distributed variant is McMahan et al.'s central mechanism (the server adds N(0, σ²S²) to
the sum of clipped updates) without trusting the server: it needs secure aggregation
(``--defense secagg``), which hides every share but the sum, and it is refused without it.

Accounting (Opacus's RDP or PRV accountant, :func:`fedleak.defenses.dpsgd.make_accountant`):

- distributed: adding or removing one user moves the sum by at most S, so a round is the
  Gaussian mechanism with noise multiplier σ, and with user sampling rate q (the federation
  picks each user independently with probability q per round) R rounds are the Poisson
  subsampled Gaussian mechanism (σ, q) composed R times — McMahan et al.'s moments accountant;
- local: the server sees this user's own update, so there is no amplification by sampling
  (q = 1) and the neighbouring inputs are two updates of the same user (any two data sets),
  whose clipped versions differ by at most 2S: noise multiplier σ / 2 per round the user
  took part in.

Sharp edges: in the distributed variant a user that drops out of secure aggregation takes its
share of the noise with it, so the sum of n' < n survivors carries only σ²S²·n'/n (the ε
reported assumes all n shares). ε is per user; every user of a victim is accounted alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.dpsgd import ACCOUNTANTS
from fedleak.defenses.mechanism import UPDATE, Clip, Mechanism, Noise, Shares
from fedleak.defenses.stages import GaussianClaim, UpdateDefense

VARIANTS = ("local", "distributed")


@dataclass
class ClientDPConfig:
    """Client-level DP's parameters: clip S, noise multiplier σ, variant, users, q, δ."""

    clip_norm: float = field(default=1.0, metadata={
        "help": "S: the user's whole update is clipped to this L2 norm"})
    noise_multiplier: float = field(default=1.0, metadata={"help": "σ: noise std / S"})
    variant: str = field(default="local", metadata={
        "help": "local (the user adds N(0, σ²S²)) or distributed (each of n users adds "
                "N(0, σ²S²/n); needs secagg)"})
    users: int = field(default=0, metadata={
        "help": "distributed: n users share the noise (0: every user of the victim)"})
    user_sample_rate: float = field(default=1.0, metadata={
        "help": "q: the federation's chance of picking this user in a round (accountant)"})
    delta: float = field(default=1e-5, metadata={"help": "δ of the reported (ε, δ)"})
    accountant: str = field(default="rdp", metadata={"help": "rdp or prv"})

    def __post_init__(self) -> None:
        """Refuse a value that names no mechanism; the message names the parameter."""
        if not self.clip_norm > 0 or not math.isfinite(self.clip_norm):
            raise ValueError(f"clip-norm must be a positive number, got {self.clip_norm}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise-multiplier must be >= 0, got {self.noise_multiplier}")
        if not self.noise_multiplier * self.clip_norm <= 1e36:  # float32 max is 3.4e38
            raise ValueError(f"noise std σ·S = {self.noise_multiplier:g}·{self.clip_norm:g} "
                             "would turn float32 updates into infinities; keep it <= 1e36")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got "
                             f"{self.variant!r}")
        if self.users < 0:
            raise ValueError(f"users must be >= 0 (0: every user of the victim), got "
                             f"{self.users}")
        if not 0 < self.user_sample_rate <= 1:
            raise ValueError(f"user-sample-rate must lie in (0, 1], got "
                             f"{self.user_sample_rate}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {list(ACCOUNTANTS)}")


@register_defense("client-dp")
class ClientDP(UpdateDefense):
    """Clip the user's whole update to S and add N(0, σ²S²) (or a 1/n share of it)."""

    Config = ClientDPConfig
    config: ClientDPConfig

    def __init__(self, config: ClientDPConfig | None = None) -> None:
        super().__init__(config)
        self._users = max(self.config.users, 1)

    def bind_users(self, num_users: int) -> None:
        """Every user of the victim shares the noise unless ``users`` says how many."""
        if self.config.users == 0:
            self._users = max(num_users, 1)

    def chain_problem(self, has_transport: bool) -> str | None:
        """Refuse the distributed variant without secure aggregation to hide its shares."""
        if self.config.variant == "distributed" and not has_transport:
            return ("client-dp variant=distributed splits the noise among the users, so the "
                    "server must see only their sum: add --defense secagg (with --users K), or "
                    "use variant=local")
        return None

    @property
    def noise_std(self) -> float:
        """The std of the noise this user adds per coordinate: σS, or σS/√n distributed."""
        c = self.config
        share = self._users if c.variant == "distributed" else 1
        return c.noise_multiplier * c.clip_norm / math.sqrt(share)

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """Return Δ · min(1, S / ‖Δ‖₂) + N(0, s² I), s = σS (local) or σS/√n (distributed).

        The clip π(Δ, S) and the noise of McMahan et al. 2018, Algorithm 1, drawn from
        ``generator``; the norm is over every tensor together, in float64.
        """
        norm = torch.stack([(u.double() ** 2).sum() for u in update]).sum().sqrt()
        scale = min(1.0, self.config.clip_norm / max(float(norm), 1e-12))
        std = self.noise_std
        return [u * scale + std * torch.randn(u.shape, generator=generator, dtype=u.dtype,
                                              device=u.device) for u in update]

    def mechanism(self) -> Mechanism:
        """Declare the whole update clipped to S, then N(0, σ²S²).

        The noise is added by the user (local) or in n shares of N(0, σ²S²/n) whose
        secure-aggregation sum carries all of it (distributed; a dropped share is not
        compensated). The accountant reads this (module docstring).
        """
        c = self.config
        shares = Shares(self._users) if c.variant == "distributed" else None
        return Mechanism(UPDATE, clip=Clip(c.clip_norm),
                         noise=Noise(c.noise_multiplier * c.clip_norm), shares=shares,
                         accountant=c.accountant, delta=c.delta, unit="user",
                         user_sample_rate=c.user_sample_rate)

    def gaussian_claim(self) -> GaussianClaim:
        """Clip to S, then N(0, s²) with s this user's share of the noise."""
        return GaussianClaim(clip_norm=self.config.clip_norm, noise_std=self.noise_std)
