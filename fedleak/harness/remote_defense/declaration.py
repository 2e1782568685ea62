"""A declared mechanism on the wire: :class:`~fedleak.defenses.mechanism.Mechanism` ↔
``fedleak.v1.GaussianClaim`` (``DefenseInfo.claim``).

Fields 1–2 (clip_norm, noise_std) alone keep their first reading — an update-stage total clip
then Gaussian noise — so services written before the declaration grew are read as before;
fields 3 on carry the stage, the clip geometry, the noise's distribution, the sampling, the
accountant and δ, the shares and their dropout behaviour. A remote defense is judged by its
declaration exactly as an in-process one is.
"""

from __future__ import annotations

from fedleak.defenses.mechanism import (
    FIXED,
    GAUSSIAN,
    TOTAL,
    UNCOMPENSATED,
    UPDATE,
    Clip,
    DeclarationError,
    Mechanism,
    Noise,
    Sampling,
    Shares,
)
from fedleak.v1 import defense_pb2 as dpb


def mechanism_to_pb(mechanism: Mechanism) -> dpb.GaussianClaim:
    """The declaration as ``DefenseInfo.claim``."""
    clip, noise = mechanism.clip, mechanism.noise
    return dpb.GaussianClaim(
        clip_norm=clip.norm if clip is not None else 0.0,
        noise_std=noise.std if noise is not None else 0.0,
        stage=mechanism.stage,
        clip_geometry=clip.geometry if clip is not None else "",
        group_clip_norms=list(clip.group_norms) if clip is not None else [],
        noise=noise.distribution if noise is not None else "",
        sampling=mechanism.sampling.kind, sample_rate=mechanism.sampling.rate,
        accountant=mechanism.accountant, delta=mechanism.delta,
        shares=mechanism.shares.users if mechanism.shares is not None else 0,
        dropout=mechanism.shares.dropout if mechanism.shares is not None else "",
        unit=mechanism.unit, user_sample_rate=mechanism.user_sample_rate)


def mechanism_from_pb(claim: dpb.GaussianClaim) -> Mechanism:
    """``DefenseInfo.claim`` as a declaration; :class:`DeclarationError` names what is wrong."""
    if not (claim.clip_norm >= 0 and claim.noise_std >= 0):
        raise DeclarationError("clip_norm and noise_std must be >= 0")
    clip = Clip(claim.clip_norm, claim.clip_geometry or TOTAL,
                tuple(claim.group_clip_norms)) if claim.clip_norm > 0 else None
    noise = Noise(claim.noise_std, claim.noise or GAUSSIAN) if claim.noise_std > 0 else None
    shares = Shares(claim.shares, claim.dropout or UNCOMPENSATED) if claim.shares > 0 else None
    return Mechanism(claim.stage or UPDATE, clip=clip, noise=noise,
                     sampling=Sampling(claim.sampling or FIXED, claim.sample_rate),
                     shares=shares, accountant=claim.accountant, delta=claim.delta or 1e-5,
                     unit=claim.unit, user_sample_rate=claim.user_sample_rate or 1.0)
