"""The interfaces defenses implement, by the stage at which they act.

- ``parameters``: on the model and parameters the server sent, before any training (``vet``
  refuses parameters built to leak).
- ``per-example``: inside the user's local training, on per-example gradients (DP-SGD).
- ``update``: on the finished update before it leaves the user (clip, noise, prune, quantise).
- ``transport``: on the way to the server (secure aggregation across several users).

A defense's mechanism and parameters are public (Kerckhoffs): ``Describe`` reports them. Its
randomness is not: it draws from the ``torch.Generator`` the victim hands it.

Every defense *declares* what it claims with :meth:`Defense.mechanism` (a
:class:`~fedleak.defenses.mechanism.Mechanism`: stage, clip and geometry, noise, sampling,
shares); the victim's claim, accountant, Fisher ceiling, DP release and refusals read only the
declaration, never the class, so a plug-in is judged like a built-in.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from fedleak.defenses.mechanism import (
    POISSON,
    UPDATE,
    Clip,
    DeclarationError,
    Mechanism,
    Noise,
)

if TYPE_CHECKING:
    from fedleak.defenses.accounting import DeclaredAccountant

STAGES = ("parameters", "per-example", "update", "transport")


@dataclass(frozen=True)
class GaussianClaim:
    """What an update defense claims to do to the update, for DP accounting and audits.

    The defense maps Δ to ``clip(Δ) + ξ`` with clip(Δ) = Δ · min(1, S / ‖Δ‖₂) (S =
    ``clip_norm``; None: no clipping, the identity) and ξ ~ N(0, s² I), s = ``noise_std`` (0:
    no noise). Projection onto the ball is 1-Lipschitz, so two inputs at L2 distance at most r
    leave it at most min(r, 2S) apart; the noise then makes it a Gaussian mechanism with
    μ = min(r, 2S) / s (Dong, Roth & Su 2019). A defense that does something else (prune,
    quantise, Laplace noise) claims nothing (None) and an audit treats it as unbounded.

    A shorthand for the update-stage :class:`~fedleak.defenses.mechanism.Mechanism` it stands
    for (:meth:`as_mechanism`); plug-ins written against it keep working.
    """

    clip_norm: float | None = None
    noise_std: float = 0.0

    def __post_init__(self) -> None:
        """Refuse a clip norm that is not positive and a negative noise std."""
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"a claimed clip norm must be positive, got {self.clip_norm}")
        if not self.noise_std >= 0:
            raise ValueError(f"a claimed noise std must be >= 0, got {self.noise_std}")

    def distance_after_clip(self, distance: float) -> float:
        """How far apart two inputs at most ``distance`` apart are after the clipping."""
        return distance if self.clip_norm is None else min(distance, 2 * self.clip_norm)

    def as_mechanism(self) -> Mechanism:
        """Return the update-stage declaration: a total clip to S (if any), then N(0, s²)."""
        return Mechanism(UPDATE, clip=None if self.clip_norm is None else Clip(self.clip_norm),
                         noise=Noise(self.noise_std) if self.noise_std > 0 else None)


class Defense(ABC):
    """A defense with a typed ``Config`` dataclass."""

    name: ClassVar[str] = ""
    stage: ClassVar[str] = "update"
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def public_params(self) -> dict[str, str]:
        """Return the configuration as strings, as ``DefenseSpec.params`` carries it."""
        return {k.replace("_", "-"): str(v) for k, v in dataclasses.asdict(self.config).items()}

    def mechanism(self) -> Mechanism | None:
        """Declare what this defense claims to do, or None when it claims no DP mechanism.

        A :class:`~fedleak.defenses.mechanism.Mechanism`: everything that reasons about privacy
        reads this, never the class; declare what the implementation does, and an audit tests
        it.
        """
        return None

    def declared(self) -> Mechanism | None:
        """:meth:`mechanism`, checked: its stage must be this defense's stage."""
        mechanism = self.mechanism()
        if mechanism is not None and mechanism.stage != self.stage:
            raise DeclarationError(f"defense {self.name!r} acts at stage {self.stage!r} but "
                                   f"declares a {mechanism.stage!r} mechanism")
        return mechanism

    def own_accountant(self) -> DeclaredAccountant | None:
        """Return an accountant over this defense's declaration alone (made on first use).

        None when it declares no accounted mechanism. For direct use of one defense; the victim
        accounts its whole chain (:class:`~fedleak.defenses.composition.ChainAccountant`).
        """
        from fedleak.defenses.accounting import DeclaredAccountant, accounted

        mechanism = self.declared()
        if mechanism is None or accounted(mechanism) is None:
            return None
        if getattr(self, "_own_accountant", None) is None:
            self._own_accountant = DeclaredAccountant(mechanism)
        own: DeclaredAccountant = self._own_accountant
        return own


class UpdateDefense(Defense):
    """Transforms the finished update ``[Δ_l]`` (one tensor per parameter) before it is sent."""

    stage: ClassVar[str] = "update"
    parameter_names: tuple[str, ...] = ()

    def bind(self, parameter_names: Sequence[str]) -> None:
        """Learn the names of the update's tensors, in order, once the model is known.

        Called by the victim before the first :meth:`apply`; most defenses ignore the names.
        """
        self.parameter_names = tuple(parameter_names)

    def bind_users(self, num_users: int) -> None:
        """Learn how many users' updates the victim sums (secure aggregation; 1 otherwise)."""

    def chain_problem(self, has_transport: bool) -> str | None:
        """Why this defense cannot run in a chain with (or without) a transport defense."""
        return None

    @abstractmethod
    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """Return the defended update, drawing any randomness from ``generator``.

        Must not modify ``update`` (one tensor per parameter, in model order) in place.
        """

    def account_round(self, rounds: int = 1, report: bool = True) -> dict[str, str]:
        """Charge ``rounds`` more rounds of this defense alone; return the privacy spent.

        Metadata entries ({} if it declares no clipped Gaussian mechanism), by its
        declaration's accountant (:mod:`fedleak.defenses.accounting`). The victim accounts its
        whole chain instead (:class:`~fedleak.defenses.composition.ChainAccountant`); this is
        for direct use.
        """
        own = self.own_accountant()
        return {} if own is None else own.charge(rounds, own.round_rate(), report)

    def gaussian_claim(self) -> GaussianClaim | None:
        """Declare a clip then Gaussian noise (:class:`GaussianClaim`), or None.

        A shorthand: :meth:`mechanism` reads it unless overridden.
        """
        return None

    def mechanism(self) -> Mechanism | None:
        """Return the declaration: :meth:`gaussian_claim`'s, unless a subclass declares more."""
        claim = self.gaussian_claim()
        return None if claim is None else claim.as_mechanism()


class ParameterCheck(Defense):
    """Inspects what the server sent before the user trains on it, and refuses it or not."""

    stage: ClassVar[str] = "parameters"

    @abstractmethod
    def inspect(
        self,
        model: torch.nn.Module,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        images: torch.Tensor,
    ) -> str | None:
        """Return why the user refuses to train at ``parameters``, or None to accept them.

        ``images`` are the round's private batch, normalised. Must not change anything.
        """

    def refuses_model(self, model: torch.nn.Module) -> str | None:
        """Return why this check will refuse *every* round whatever θ the server sends, or None.

        Judged from the user's own ``model`` alone (said once when the user starts).
        """
        return None


class PerExampleDefense(Defense):
    """Turns per-example gradients of one local step into the gradient the step uses."""

    stage: ClassVar[str] = "per-example"

    @abstractmethod
    def privatise(
        self,
        per_example: list[torch.Tensor],
        expected_batch_size: int,
        generator: torch.Generator,
    ) -> list[torch.Tensor]:
        """Return the gradient of one local step from its per-example gradients.

        ``per_example[l]`` has shape ``[B, *θ_l.shape]``; one tensor per parameter comes back.
        """

    def sample_rate(self, num_images: int, batch_size: int) -> float | None:
        """Return the Poisson rate q the harness draws local batches at, or None.

        None: the protocol's batches (in order, or shuffled when the protocol shuffles). This
        is the *implementation*; by default it follows the declaration's sampling.
        """
        mechanism = self.declared()
        if mechanism is None or mechanism.sampling.kind != POISSON:
            return None
        return mechanism.sampling.poisson_rate(num_images, batch_size)

    def account(self, steps: int, sample_rate: float, report: bool = True) -> dict[str, str]:
        """Charge ``steps`` more steps at ``sample_rate``; return the privacy spent.

        By this defense alone (metadata entries; {} without a declared Gaussian mechanism),
        by its declaration's accountant; with ``report`` False the steps are only charged (no
        ε computed).
        """
        own = self.own_accountant()
        return {} if own is None else own.charge(steps, sample_rate, report)


class TransportDefense(Defense):
    """Acts between users on the way to the server (secure aggregation).

    The victim's users run its protocol together, each round under :meth:`session_config`'s
    public parameters.
    """

    stage: ClassVar[str] = "transport"

    @abstractmethod
    def threshold(self, num_users: int) -> int:
        """How many of ``num_users`` must stay to the end; refuses an impossible setting."""

    @abstractmethod
    def session_config(self, num_users: int, vector_length: int, session: int) -> Any:
        """Return the public parameters of one aggregation round among ``num_users`` users."""

    def minority_warning(self, num_users: int) -> str | None:
        """Return a warning a person must read when this setting is weaker than the default."""
        return None
